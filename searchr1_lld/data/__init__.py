"""QA datasets from outside the project: the FlashRAG benchmark collection (hub or a local mirror, flashrag.py)
and the dataset specs a run or an evaluation names (specs.py)."""
