"""advisor: parallelization advice for training large neural networks."""

__version__ = "0.1.0"
