"""blkps.torch_embedding: the former name of blkps.torch.embedding (Embedding,
EmbeddingBag: rows on a table LUN), kept for code that imports it."""

from blkps.torch.embedding import Embedding, EmbeddingBag

__all__ = ["Embedding", "EmbeddingBag"]
