"""Zero-patch capture of RL phases from framework log files the node agent follows
(``moeplane agent --follow verl=PATH --follow areal=DIR``): :mod:`.verl` and :mod:`.areal` turn
records into spans, :mod:`.tail` reads new lines and sends them as ``RLReport`` messages."""
