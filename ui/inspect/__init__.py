"""The Inspect tab: `tab` lays it out and wires its controls; `attention` draws the attention heatmaps and
the positional encodings; `interventions` (its contents in `intervention_views`) and `circuits` are the
panels under the heatmaps; `actions` is the action box through which the controls of all three reach them."""
