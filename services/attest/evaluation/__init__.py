"""Evaluation of retrieval and answering through the public APIs."""
