"""Presets: one click trains a set of runs that answers a question by measurement. `catalog` registers them
all (the papers' known results), `why` holds the paper's own questions, `table3` Table 3 at toy scale,
`stability` the norm x learning-rate x warmup grid; `base` is what every preset shares and `results` what an
explanation reads of the stored runs."""
