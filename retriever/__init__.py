"""retriever: e5/BM25 + FAISS search service speaking the Search-R1 `/retrieve` protocol."""
