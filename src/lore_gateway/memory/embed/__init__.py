"""Offline sentence embeddings: the model, its process and the vector index."""
