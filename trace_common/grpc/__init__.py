"""gRPC plumbing shared by the services: server bootstrap, interceptors, client channels."""
