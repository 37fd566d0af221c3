"""The why-attention preset quotes tokens/s against sequence length as benchmarks/sequence_length.py stored
them (lab/teach/length_scan.py, lab/teach/sequence_length.json): the sentence follows the numbers given."""
from __future__ import annotations

from lab.teach import length_scan
from lab.teach.presets.catalog import PRESETS
from lab.records import EXACT_MATCH, LOSS


def scan(cpu: list[tuple[int, float, float]], cuda: list[tuple[int, float, float]] = ()) -> dict:
    def entry(rows, device):
        return {"device": device, "rows": [{"T": t, "B": 2048 // t, "transformer": tf, "lstm": ls} for t, tf, ls in rows]}
    return {"cpu": entry(cpu, "one CPU thread")} | ({"cuda": entry(cuda, "NVIDIA H100 80GB HBM3")} if cuda else {})


def test_the_sentence_reads_the_ratios_and_where_the_transformer_overtakes():
    text = length_scan.sentence(scan([(16, 64_000, 68_000), (256, 48_000, 84_000)],
                                     [(16, 380_000, 509_000), (256, 410_000, 585_000), (1024, 300_000, 244_000)]))
    assert text == (f"against sequence length (benchmarks/sequence_length.py) on one CPU thread the LSTM's tokens/s "
                    f"went from {68 / 64:.2f}x at T = 16 to {84 / 48:.2f}x at T = 256 of the Transformer's, and on "
                    f"NVIDIA H100 80GB HBM3 the Transformer overtook it at T = 1024 ({300 / 244:.2f}x), where the "
                    "recurrence's sequential steps dominate."), text
    behind = length_scan.sentence(scan([(16, 70_000, 68_000)], [(16, 1.0, 2.0), (64, 1.0, 2.0)]))
    assert "from 0.97x at T = 16 to 0.97x at T = 16 of the Transformer's" in behind, behind
    assert "stayed ahead up to T = 64, the longest measured" in behind, behind
    assert length_scan.sentence({}) == ""


def test_the_stored_scan_is_what_the_preset_quotes():
    stored = length_scan.load()
    assert {"cpu", "cuda"} <= set(stored), "run benchmarks/sequence_length.py (and with --device cuda on a GPU)"
    for entry in stored.values():
        assert len(entry["rows"]) >= 3 and all(r["transformer"] > 0 and r["lstm"] > 0 for r in entry["rows"])
    summary = {"params": 105_600, "steps": 600, "tokens_per_s": 50_000.0, "eval": {LOSS: 0.01, EXACT_MATCH: 1.0}}
    lstm = {"params": 105_440, "steps": 600, "tokens_per_s": 60_000.0, "eval": {LOSS: 1.9, EXACT_MATCH: 0.0}}
    text = PRESETS["why_attention"].explain({"Transformer": summary, "LSTM": lstm})
    assert "; " + length_scan.sentence(stored) in text and "against the Transformer's 50,000; against" in text, text
    assert len(text) < 900 and text.count(". ") + text.count("; ") <= 6, text
