-- Nothing rotated since the install: the window's older generation (0) never held a message.
SELECT tree_x.queue_create('e');
