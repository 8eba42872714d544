-- A rotation that sees a message of q (and of e) in the generation it closes: the record says
-- both may hold rows in the window's older generation (as after a rotation under sustained sends).
SELECT tree_x.queue_create('e');
SELECT tree_x.send_plain('q', '\x00'::bytea);
SELECT tree_x.send_plain('e', '\x00'::bytea);
SELECT tree_x.rotate(p_force => true);
SELECT tree_x.queue_purge('e');
