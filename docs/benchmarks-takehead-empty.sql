-- Set-up of docs/benchmarks.md, "take()'s head, counted": an empty queue e (schema tree_x).
SELECT tree_x.queue_create('e');
