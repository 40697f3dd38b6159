"""Search over stored messages: the query, the ranking, the hits, their rendering."""
