"""tracectl: the TRACE command line. It drives the pipeline through the services' gRPC APIs."""
