"""data: QA benchmark preparation and the synthetic search world."""
