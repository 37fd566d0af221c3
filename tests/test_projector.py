"""Projector mode (ui/projector.py): a preset's explanation as a headline, its first sentence with its number,
and the rest folded under it; the same text otherwise. The page itself is tested in Chromium in
tests/test_preset_cards.py (the address, the toggle, the browser's memory, the fold)."""
from __future__ import annotations

import re

from ui.knobs import values_from_query
from ui.projector import folded


def plain(markup: str) -> str:
    return re.sub(r"</?span[^>]*>", "", markup)


def test_the_headline_is_the_first_sentence_with_its_number_and_the_rest_folds_under_it():
    text = ("The 2-layer model's held-out loss fell to 0.80 on 256 held-out sequences (below half the 1-layer "
            "loss from step 400 of 800 on); the 1-layer model's stayed at 2.94 (guessing costs ln 20 = 3.00). "
            "Copying a repeat needs an induction head, e.g. a previous-token head in layer 0. It forms abruptly.")
    marked = folded(text)
    head = re.search(r'<span class="lab-headline">(.*?)</span>', marked).group(1)
    assert head.endswith("(guessing costs ln 20 = 3.00).") and "0.80" in head  # "2.30" and "e.g." do not end it
    rest = re.search(r'<span class="lab-rest">(.*)</span></span>$', marked).group(1)
    assert rest.startswith("Copying a repeat") and rest.endswith("It forms abruptly.")
    assert plain(marked) == text  # outside projector mode: the same words


def test_one_sentence_is_all_headline_and_a_table_is_left_as_it_is():
    assert folded("Solved: 100% exact-match.") == '<span class="lab-headline">Solved: 100% exact-match.</span>'
    table = "Measured here:\n\n| row | loss |\n|---|---|\n| A | 0.5 |"
    assert folded(table) == table


def test_the_address_may_ask_for_projector_mode_without_a_word_about_an_unknown_option():
    values, hide, problems = values_from_query({"projector": "1", "seed": "3"})
    assert problems == [] and values == {"train.seed": 3}
