"""Projector mode: the page for a class in front of one screen. A toggle at the top of the page, or
`?projector=1` in the address (a teacher's bookmark), and the browser keeps the choice for the next visit.

In projector mode the whole page is drawn larger on a screen 700 px wide or more (CSS zoom: type, plots and
controls alike, so a 1280 x 720 projector shows what a 950 px window would, readable from the back of the room;
a phone keeps its size), and a preset's result
reads as one headline sentence, the one with its number, with the rest of the explanation folded under it
(a click on the headline unfolds it), and Inspect's panels come folded in sections under the heatmaps, for the
teacher to open one at a time. Outside it the page is unchanged: the same sentences, in one paragraph.
Nothing is sent to the server: the toggle is the browser's alone.
"""
from __future__ import annotations

import re

import gradio as gr

from ui.common import PRIVATE

URL_KEY = "projector"  # ?projector=1 (ui/knobs.py leaves it to this module)
STORAGE_KEY = "lab-projector"
ZOOM = 1.35
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(*])")  # "2.30" and "e.g. a" do not end a sentence

PROJECTOR_CSS = f"""
body.lab-projector.lab-wide .gradio-container {{zoom: {ZOOM}}}
body.lab-projector .lab-headline {{display: block; font-size: 1.35em; font-weight: 600; cursor: pointer}}
body.lab-projector .lab-fold > .lab-headline::after {{content: "  ▸ the whole explanation"; font-size: 0.6em; font-weight: 400;
  opacity: 0.7}}
body.lab-projector .lab-open .lab-headline::after {{content: "  ▾"}}
body.lab-projector .lab-rest {{display: none}}
body.lab-projector .lab-open .lab-rest {{display: inline}}
"""

# the page's scripts: set the mode (the body's classes, the browser's memory of it: `labProjector`), keep
# "lab-wide" on a screen WIDE_PX wide or more (a phone keeps its size), and unfold a clicked headline. Rules in
# an @media block of the app's CSS are scoped by Gradio under its container, where no body is: hence a class.
WIDE_PX = 700
SECTION_CLASS = "lab-section"
PROJECTOR_JS = f"""
// a section's label toggles it (Gradio's accordion). Each section is set once per mode, folded in projector
// mode and open otherwise, then left to the reader; a click too early for the accordion is repeated at the
// page's next change until the section shows the state asked
const labSections = (fold) => {{
  for (const sec of document.querySelectorAll('.{SECTION_CLASS}')) {{
    const label = sec.querySelector('.label-wrap');
    if (!label || sec.dataset.labFold === String(fold)) continue;
    if (label.classList.contains('open') === fold) label.click();
    else sec.dataset.labFold = String(fold);
  }}
}};
window.labProjector = (on) => {{
  document.body.classList.toggle('lab-projector', !!on);
  document.body.classList.toggle('lab-wide', window.innerWidth >= {WIDE_PX});
  try {{ localStorage.setItem('{STORAGE_KEY}', on ? '1' : '0'); }} catch (e) {{}}
  labSections(!!on);
}};
// and sections drawn later (a tab's content appears when the tab is first opened)
let labSectionsQueued = false;
new MutationObserver(() => {{
  if (labSectionsQueued) return;
  labSectionsQueued = true;
  requestAnimationFrame(() => {{
    labSectionsQueued = false;
    labSections(document.body.classList.contains('lab-projector'));
  }});
}}).observe(document.body, {{childList: true, subtree: true, attributes: true, attributeFilter: ['class']}});
window.addEventListener('resize', () => document.body.classList.toggle('lab-wide', window.innerWidth >= {WIDE_PX}));
document.addEventListener('click', (e) => {{
  const head = e.target instanceof Element ? e.target.closest('.lab-headline') : null;
  if (head && document.body.classList.contains('lab-projector')) head.parentElement.classList.toggle('lab-open');
}});
"""
_SET_JS = "(on) => { window.labProjector(on); }"
# the mode at page load: the address first, then the browser's memory
_LOAD_JS = f"""() => {{
  const asked = new URLSearchParams(location.search).get('{URL_KEY}');
  let kept = null;
  try {{ kept = localStorage.getItem('{STORAGE_KEY}'); }} catch (e) {{}}
  const on = (asked ?? kept) === '1' || asked === 'true';
  window.labProjector(on);
  return on;
}}"""


def section(label: str, elem_id: str) -> gr.Accordion:
    """A section of a long page (Inspect's panels), open, folded by a click on its label; projector mode folds
    every section as it appears, so the class sees the page's top and the one section the teacher opens."""
    return gr.Accordion(label, open=True, elem_id=elem_id, elem_classes=[SECTION_CLASS])


def folded(explanation: str) -> str:
    """`explanation` as a headline (its first sentence) and the rest, marked for projector mode: the same
    text in one paragraph otherwise."""
    if "\n" in explanation.strip():  # a table or several paragraphs (Table 3's): kept as they are
        return explanation
    parts = _SENTENCE_END.split(explanation.strip(), maxsplit=1)
    if len(parts) < 2:
        return f'<span class="lab-headline">{parts[0]}</span>'
    return f'<span class="lab-fold"><span class="lab-headline">{parts[0]}</span> <span class="lab-rest">{parts[1]}</span></span>'


def build_projector_toggle() -> gr.Checkbox:
    """The toggle (rendered where it is called), wired in the browser only."""
    toggle = gr.Checkbox(False, label=f"Projector mode: larger type, each preset's result as one headline (or "
                                      f"?{URL_KEY}=1 in the address)", elem_id="projector", container=False)
    toggle.change(None, inputs=toggle, js=_SET_JS, api_name="projector", api_visibility=PRIVATE, queue=False)
    return toggle


def wire_projector_load(demo: gr.Blocks, toggle: gr.Checkbox) -> None:
    """At page load, the toggle shows the mode the address or the browser's memory asks for."""
    demo.load(None, outputs=toggle, js=_LOAD_JS, api_name="projector_load", api_visibility=PRIVATE, queue=False)
