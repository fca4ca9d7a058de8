"""The course room: what only the notebooks use (plots, the block-scheduling model, exercise checkers).

Nothing here is needed to call the kernels; ``import gpt2enc_edu`` does not import it. Worked solutions live
outside the package, in the repository's ``solutions/`` folder.
"""
