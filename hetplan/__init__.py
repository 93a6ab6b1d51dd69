"""hetplan: plan and schedule heterogeneous GPU clusters for DNN training under a budget."""

__version__ = "0.1.0"
