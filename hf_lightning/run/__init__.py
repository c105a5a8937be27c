"""The run on disk: its folder and the folder's owner lock, the loggers, the faults of ``fit``, its end."""
