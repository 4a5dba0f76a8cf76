"""`pgrecv snapshot`: the initial copy of a slot's exported snapshot."""
