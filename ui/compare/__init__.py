"""The Compare tab's widgets and events: `tab` lays it out and wires its controls, `render` turns the controls
into the widgets' updates, `class_board` publishes the picked runs to a Trackio board. What it draws comes
from lab/views/compare_frames.py and lab/views/compare_figures.py (the frames and figures that the PNG export
and the Python API draw too)."""
