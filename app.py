"""Transformer Ablation Lab: `python app.py` starts the Gradio app locally; on a Hugging Face Space the same
file is the entry point. The app itself is ui/app.py (`build_demo()` builds the page without launching it);
its names are here too, as tests and older scripts import them from `app`."""
from ui.app import CSS, TITLE, blocked_paths, build_demo, main  # noqa: F401

if __name__ == "__main__":
    main()
