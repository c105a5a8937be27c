"""The contracts every layer shares: the errors, the batch keys, the argument facts."""
