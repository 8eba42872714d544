SELECT tree_x.queue_create('e');
