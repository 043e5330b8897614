"""The micro world: its data generator (`world`), the backbone's pretraining recipe (`pretrain`) and the quick
checks pretraining logs (`quick_eval`)."""
