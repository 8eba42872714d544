-- The three partial indexes of message that a plain send never enters (the upper bound of a
-- send without them; not a change: each serves a guarantee).
DROP INDEX tree_x.message_channel_idx; DROP INDEX tree_x.message_key_idx; DROP INDEX tree_x.message_leased_idx;
