"""`tracectl run`: the whole TRACE loop, stage by stage, through the services' gRPC APIs."""
