"""The page's own scripts, for what Gradio 6.31's widgets do without a word (passed to `launch(head=...)` with
Inspect's step keys, ui/inspect/tab.py). Each says what it refused in a note under the widget (class
`lab-refused`, role alert), naming the widget by its label, and the note goes at the next valid entry.

- A slider's number box clamps a typed value to the slider's range when it is left (Tab, Enter, a click
  elsewhere): Layers 500 became 8 and trained without a word. The note says what was typed, what the slider
  allows and what it was set to.
- "Runs to compare" keeps typed text the way a run id is kept (it must hold run ids an API call or a preset
  sets, so it allows values outside its list): Enter added "alibi" as a run. Typing now only filters: Enter
  picks the highlighted run, or the first one the text matches, and with no match adds nothing and says so.
"""
from __future__ import annotations

NOTE_JS = """
const labNote = (block, text) => {
  let p = block.querySelector(':scope > .lab-refused');
  if (!text) { if (p) p.remove(); return; }
  if (!p) {
    p = document.createElement('p');
    p.className = 'lab-refused';
    p.setAttribute('role', 'alert');
    block.appendChild(p);
  }
  p.textContent = text;
};
const labLabel = (block) => (block.querySelector('[data-testid="block-info"]')?.textContent || '').trim();
"""

SLIDER_LIMITS_JS = """
const labSliderBox = (el) => el instanceof HTMLInputElement && el.dataset.testid === 'number-input'
  && el.closest('.block')?.querySelector('input[type=range]') ? el : null;
const labCheckSlider = (e) => {
  const el = labSliderBox(e.target);
  if (!el) return;
  const block = el.closest('.block'), v = Number(el.value), lo = Number(el.min), hi = Number(el.max);
  if (el.value.trim() === '' || Number.isNaN(v) || (v >= lo && v <= hi)) { labNote(block, ''); return; }
  const set = v > hi ? hi : lo;
  labNote(block, `${labLabel(block)}: ${el.value} is ${v > hi ? 'more' : 'less'} than this slider allows `
    + `(${lo} to ${hi}); it was set to ${set}.`);
};
document.addEventListener('blur', labCheckSlider, true);  // capture: before the box's own blur clamps it
document.addEventListener('keydown', (e) => { if (e.key === 'Enter') labCheckSlider(e); }, true);
document.addEventListener('input', (e) => {
  if (e.target instanceof HTMLInputElement && e.target.type === 'range') labNote(e.target.closest('.block'), '');
}, true);
"""

PICK_FILTERS_JS = """
document.addEventListener('keydown', (e) => {
  const box = e.target;
  const pick = box instanceof HTMLInputElement ? box.closest('#compare-pick') : null;
  if (!pick || e.key !== 'Enter') { if (pick) labNote(pick, ''); return; }
  const typed = box.value.trim();
  const options = [...pick.querySelectorAll('li[data-testid="dropdown-option"]')];
  if (!typed || options.some((o) => o.classList.contains('active'))) return;  // Gradio picks the highlighted run
  // highlight the first run the text matches that is not picked yet (Enter on a picked one would unpick
  // it); this Enter then picks it
  const first = options.findIndex((o) => o.getAttribute('aria-selected') !== 'true');
  if (first >= 0) {
    for (let i = 0; i <= first; i++) box.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowDown', bubbles: true}));
    return;
  }
  e.preventDefault();
  e.stopImmediatePropagation();
  labNote(pick, options.length
    ? `${labLabel(pick)}: every stored run that matches "${typed}" is picked already.`
    : `${labLabel(pick)}: no stored run matches "${typed}"; typing filters the list, and Enter or a `
      + 'click picks a run from it.');
}, true);
"""

PAGE_JS = f"(() => {{{NOTE_JS}{SLIDER_LIMITS_JS}{PICK_FILTERS_JS}}})();"
PAGE_CSS = ".lab-refused {color: var(--error-text-color, #b91c1c); font-size: var(--text-sm); margin: 4px 0 0}"
