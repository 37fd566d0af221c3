"""The Learn tab's pages: a few sentences, a formula and an exercise each, in data-flow order.

Prose, formula and picture side by side, in the manner of the Annotated Transformer (Rush 2018).
Formulas are LaTeX between `$$` (display) or `$` (inline) for KaTeX. The pictures are drawn by
`lab.teach.lesson_figures`, from the data in `lab.teach.lessons`. Pure text: no torch, no gradio.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    key: str  # "mask": the figure builder's key
    title: str  # shown in the page list
    text: str  # a few sentences (Markdown, inline LaTeX allowed)
    formula: str  # display LaTeX, without delimiters
    exercise: str  # what to look at / do in the picture


PAGES: tuple[Page, ...] = (
    Page("embedding", "1 · Token embedding",
         "A Transformer reads vectors, not symbols. Each token id picks one row of a learned table $E$ with a "
         "row per symbol of the vocabulary; that row, $d_{model}$ numbers long, is where the token enters the "
         "residual stream.",
         r"x_t = E[\mathrm{tok}_t], \qquad E \in \mathbb{R}^{V \times d_{model}}",
         "Left: the table $E$, one row per symbol. Right: cosine similarity between every pair of rows. "
         "Untrained rows are random and nearly orthogonal (near 0 off the diagonal); pick a trained run "
         "and see which symbols training has moved together."),
    Page("positional", "2 · Positional encoding",
         "Attention on its own sees a set, not a sequence: swap two tokens and each one's output is unchanged "
         "(only the causal mask gives away any order). So a position signal is added to each token vector. The "
         "original Transformer adds a fixed sine/cosine vector per position; GPT-2 and BERT learn one vector per "
         "position, a table of $n_{ctx}$ rows. RoPE and ALiBi act inside attention instead (see Inspect).",
         r"h^{(0)}_t = x_t + p_t, \qquad p_{t,2i} = \sin\frac{t}{10000^{2i/d}}, \quad "
         r"p_{t,2i+1} = \cos\frac{t}{10000^{2i/d}}",
         "**Learned vs sinusoidal beyond the training length.** Middle: how similar each position's vector is "
         "to the next one. The sinusoidal curve is flat at every position, even past $n_{ctx}$: one formula "
         "makes them all. A learned table changes only at positions that training sequences reached; to the "
         "right of the dashed line its rows are still random (right: how far each row moved in training, "
         "exactly zero there). A learned-PE model has nothing sensible to add past its training length."),
    Page("qkv", "3 · Queries, keys, values",
         "Every position makes three vectors from the same input $h$: a query (what am I looking for?), a key "
         "(what do I offer?) and a value (what do I pass on if chosen?). Each is a linear map of $h$, split "
         "into $H$ heads of $d_k = d_{model}/H$ numbers.",
         r"Q = h\,W_Q, \qquad K = h\,W_K, \qquad V = h\,W_V, \qquad "
         r"W_Q, W_K, W_V \in \mathbb{R}^{d_{model} \times d_{model}}",
         "Layer 0 head 0 (the first layer's first head) for the probe input: one row per token, $d_k$ columns each. With RoPE, "
         "$q$ and $k$ are shown after their rotation."),
    Page("scaling", "4 · Scaling by √d_k",
         "The score of query $i$ for key $j$ is a dot product, a sum of $d_k$ products. If the entries of $q$ "
         "and $k$ are independent with mean 0 and variance 1, each product has mean 0 and variance 1, so the "
         "sum has variance $d_k$: wide heads give large scores, softmax saturates to "
         "one-hot and its gradients vanish. Dividing by $\\sqrt{d_k}$ brings the variance back to 1 "
         "(Vaswani et al. 2017, footnote 4).",
         r"s_{ij} = \frac{q_i \cdot k_j}{\sqrt{d_k}}, \qquad "
         r"\mathrm{Var}(q_i \cdot k_j) = d_k \;\text{ for independent entries of mean 0, variance 1}",
         "Left: the spread of $q \\cdot k$ for random vectors, with and without the scaling (measured now). "
         "Middle and right: this model's attention in layer 0 head 0 as computed, and with the scaling "
         "removed: sharper, closer to one-hot."),
    Page("mask", "5 · The causal mask",
         "A decoder learns to predict token $t+1$ from the tokens up to $t$, all positions at once. So position "
         "$t$ must not see the tokens after it, one of which is the very token it has to predict. The mask adds "
         "$-\\infty$ to those scores; after softmax their weight is exactly 0, and every pattern is "
         "lower-triangular.",
         r"M_{ij} = \begin{cases} 0 & j \le i \\ -\infty & j > i \end{cases}, \qquad "
         r"A = \mathrm{softmax}(S + M)",
         "Left: the scores with the mask applied (grey = $-\\infty$). Middle: the weights, zero above the "
         "diagonal. Right, **what leaks without it**: change one input token and see which outputs move. "
         "With the mask only that position and later ones change; without it earlier outputs change too: "
         "the future leaks into the past, and a model could learn to copy the answer instead of computing it."),
    Page("softmax", "6 · Softmax",
         "Softmax turns a row of scores into weights that are positive and sum to 1. Because of the "
         "exponential, a score larger by 1 gets $e \\approx 2.7$ times the weight. The output at position $i$ "
         "is the weighted average of the value vectors.",
         r"\alpha_{ij} = \frac{e^{s_{ij}}}{\sum_{j'} e^{s_{ij'}}}, \qquad o_i = \sum_j \alpha_{ij}\, v_j",
         "One query (the last token of the probe, layer 0 head 0): its scores, and the weights softmax "
         "makes of them. Masked keys get weight 0."),
    Page("heads", "7 · Multi-head attention",
         "Instead of one attention with $d_{model}$-wide queries, the model runs $H$ narrower ones side by "
         "side, each with its own slice of $W_Q, W_K, W_V$. Their outputs are concatenated and mixed by $W_O$. "
         "Heads are free to specialise: one looks at the previous token, another at the separator.",
         r"\mathrm{head}_h = \mathrm{softmax}\Big(\frac{Q_h K_h^\top}{\sqrt{d_k}} + M\Big) V_h, \qquad "
         r"\mathrm{MultiHead}(h) = [\mathrm{head}_1; \dots; \mathrm{head}_H]\, W_O",
         "**Attention per head**: every layer (rows) and head (columns) for the probe input. Each row of a "
         "heatmap is one query and sums to 1. Type your own input above to probe it."),
    Page("norm", "8 · Residual and layer norm",
         "Each sublayer adds its output to a running residual stream instead of replacing it, so information "
         "and gradients can pass straight through. Layer norm rescales a vector to mean 0 and variance 1, then "
         "applies a learned scale and shift. Where it sits matters: the original Transformer normalises after "
         "the addition (post-LN); GPT-2 and most later models before the sublayer (pre-LN), plus one final LN. "
         "Xiong et al. (2020) show that post-LN needs a warmup at high learning rates and pre-LN does not.",
         r"\mathrm{LN}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta, \qquad "
         r"\text{pre: } x \leftarrow x + f(\mathrm{LN}(x)), \qquad \text{post: } x \leftarrow \mathrm{LN}(x + f(x))",
         "**Pre-LN vs post-LN**: fresh models of this config's shape (at least 6 layers), identical but for "
         "the norm placement; one backward pass on a batch of the task. Left: the gradient reaching each "
         "layer with Xavier initialisation (the setting Xiong et al. analyse). Middle: the same with this lab's "
         "small GPT-2 initialisation. Right: the size of the residual stream after each layer. Then run the "
         "*Pre-LN vs post-LN* preset to see what it does to training."),
    Page("ff", "9 · Feed-forward",
         "Attention moves information between positions; the feed-forward network then works on each position "
         "alone: widen to $d_{ff}$ numbers (usually $4\\,d_{model}$), apply a nonlinearity, project back. It "
         "holds about two thirds of each block's parameters.",
         r"\mathrm{FFN}(x) = W_2\, \phi(W_1 x + b_1) + b_2, \qquad \phi = \mathrm{ReLU} \text{ or } \mathrm{GELU}",
         "Left: the hidden units of the first layer's feed-forward network for each probe token, after "
         "$\\phi$. Right: their inputs $W_1 x + b_1$ (histogram) and the nonlinearity $\\phi$: units with "
         "negative input are (nearly) switched off."),
    Page("cross", "10 · Encoder-decoder and cross-attention",
         "The original Transformer reads the prompt with an encoder, whose self-attention has no mask (every "
         "token sees every other), and writes the answer with a decoder. In each decoder block, "
         "cross-attention takes queries from the decoder and keys and values from the encoder's output $m$, "
         "so each output position can look up the part of the input it needs. A decoder-only model (GPT) puts "
         "prompt and answer in one sequence instead.",
         r"\mathrm{CrossAttn}(h, m) = \mathrm{softmax}\Big(\frac{(h W_Q)(m W_K)^\top}{\sqrt{d_k}}\Big)\, m W_V",
         "Cross-attention of every decoder layer and head: rows are output positions, columns input tokens. "
         "On *reverse*, a trained encoder-decoder draws an anti-diagonal: output $i$ reads input $n-1-i$ "
         "(the *Original encoder-decoder* preset)."),
    Page("output", "11 · Output head and parameter count",
         "A last linear map $W_U$ turns each final residual vector into one score per symbol; softmax makes "
         "that the predicted distribution of the next token. Every block adds the same number of parameters, "
         "so the size of the model grows linearly with depth.",
         r"p(\mathrm{tok}_{t+1}) = \mathrm{softmax}(h^{(L)}_t W_U), \qquad N(L) = V d + n_{ctx} d\,[\text{learned}] "
         r"+ L\,\big(\underbrace{4d^2 + 4d}_{\text{attention}} + \underbrace{2 d\, d_{ff} + d_{ff} + d}_{\text{MLP}} "
         r"+ \underbrace{4d}_{\text{2 LNs}}\big) + d V",
         "Left: the predicted distribution at each probe position (circles: the right answer). Right, "
         "**parameters against the number of layers**, from the closed-form count, per component; the dot is "
         "the count of the model actually built. Pre-LN adds one final LN ($2d$); an encoder-decoder has a "
         "second stack and cross-attention in every decoder block."),
    Page("interventions", "12 · Interventions: which parts matter",
         "A trained model can be taken apart without retraining it. Knock out one attention head (replace its "
         "output by zeros, or by its average over held-out inputs) and measure how much worse the model gets: "
         "most heads can go at little cost, a few cannot (Michel et al. 2019). In a 2-layer induction model "
         "(Olsson et al. 2022) a previous-token head in layer 0 writes each token's predecessor into its "
         "position, and induction heads in layer 1 use it to find the earlier occurrence of the current token "
         "and copy what followed. In the *Induction heads* preset's run, knocking out the layer-0 "
         "previous-token head costs many times more held-out loss than any other head; each layer-1 head alone "
         "costs a fraction of that, as the two share the copying. The map on the left measures every head of "
         "the model you picked. The logit lens asks what the "
         "model would answer if the stack stopped after a given layer: the residual stream read through the "
         "final norm and the output head.",
         r"\mathrm{head}_h \leftarrow 0 \;\text{or}\; \mathbb{E}_{\text{held-out}}[\mathrm{head}_h], \qquad "
         r"\Delta_h = \mathcal{L}_{\text{held-out}}(\text{without } h) - \mathcal{L}_{\text{held-out}}, \qquad "
         r"p^{(\ell)} = \mathrm{softmax}\big(\mathrm{LN}(h^{(\ell)})\, W_U\big)",
         "Left: $\\Delta_h$ for every head of this model, on the run's own held-out set (the numbers of "
         "Inspect's importance map and the preset's explanation). Middle: the logit lens of the probe, one row per "
         "layer. Right: the probe's answer intact and with the head that matters most knocked out. In Inspect, "
         "click a cell of the importance map to knock that head out and see the answer change; combine "
         "knockouts, skip a feed-forward layer or remove the positional encoding."),
    Page("circuits", "13 · Circuits forming",
         "A trained model's heads have roles, and training is when they appear. Give a model random tokens "
         "followed by the same tokens again ([A B C | A B C]): a *previous-token* head attends from each token "
         "to the one before it; an *induction* head attends from a repeated token to the token that followed "
         "its first occurrence, the one to copy (Olsson et al. 2022). This lab keeps each run's weights at its "
         "snapshot steps, so it can measure every head's role at each of them: the moment a circuit forms. In "
         "the *Induction heads* preset the induction score of a layer-1 head jumps within a few hundred steps, "
         "and the held-out loss falls at the same time (a phase change).",
         r"\mathrm{score}_{\text{induction}}(h) = \frac{1}{L} \sum_{i=L}^{2L-1} a^{h}_{i,\; i-L+1}, \qquad "
         r"\mathrm{score}_{\text{prev}}(h) = \frac{1}{2L-1} \sum_{i=1}^{2L-1} a^{h}_{i,\; i-1}",
         "Left and middle: every head's induction and previous-token score at each snapshot step (a row per "
         "head). Right: the held-out loss on the same step axis; the dashed line marks the step the top "
         "induction score first passed 0.4. Pick the *Induction heads* preset's 2-layer run; `python -m lab "
         "heads RUN_ID` prints all five scores."),
)
PAGE_KEYS: tuple[str, ...] = tuple(p.key for p in PAGES)


def page(key: str) -> Page:
    for p in PAGES:
        if p.key == key:
            return p
    raise KeyError(f"page: {key!r} is not a Learn page (allowed: {', '.join(PAGE_KEYS)})")


def markdown(p: Page) -> str:
    """The page as Markdown for gr.Markdown with `$$`/`$` KaTeX delimiters."""
    return f"### {p.title}\n\n{p.text}\n\n$$ {p.formula} $$\n\n{p.exercise}"
