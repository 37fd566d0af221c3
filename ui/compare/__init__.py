"""The Compare tab: `tab` lays it out and wires its controls, `render` draws every view from the controls
as they are now, `class_board` publishes the picked runs to a Trackio board. The frames it draws come from
lab/views/ (the same frames the PNG export and the Python API draw)."""
