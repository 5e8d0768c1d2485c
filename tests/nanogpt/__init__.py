"""nanoGPT's own ``model.py``, vendored unchanged (MIT licence beside it; upstream commit
3adf61e1 of github.com/karpathy/nanoGPT) so that tests train the real thing, not a look-alike."""
