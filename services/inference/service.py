"""The inference service's domain object: loaded compositions and generation (no gRPC here)."""

from __future__ import annotations

from trace_common.errors import NotFound, Unimplemented

from .settings import InferenceSettings
from .specs import CompositionSpecModel, GenerateModel


class Inference:
    def __init__(self, settings: InferenceSettings):
        self.settings = settings
        self.compositions: dict[str, CompositionSpecModel] = {}

    def load(self, spec: CompositionSpecModel):
        raise Unimplemented(f"loading compositions is not implemented yet ({spec.name!r}: base + "
                            f"{len(spec.adapters)} adapters): arrives with the MoE composition issue")

    def unload(self, name: str) -> None:
        if name not in self.compositions:
            raise NotFound(f"no loaded composition {name!r}; ListCompositions shows what is loaded")
        del self.compositions[name]

    def generate(self, req: GenerateModel):
        if req.model not in self.compositions:
            raise NotFound(f"no loaded composition {req.model!r}; load it with LoadComposition first")
        raise Unimplemented("generation arrives with the MoE composition issue")
