from . import trace
