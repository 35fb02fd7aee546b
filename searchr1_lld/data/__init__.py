"""QA datasets from outside the project: the FlashRAG benchmark collection (hub or a local mirror)."""
