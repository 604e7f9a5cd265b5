from trace.v1 import types_pb2 as _types_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union
DESCRIPTOR: _descriptor.FileDescriptor

class CompositionRouting(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    COMPOSITION_ROUTING_UNSPECIFIED: _ClassVar[CompositionRouting]
    COMPOSITION_ROUTING_TOKEN: _ClassVar[CompositionRouting]
    COMPOSITION_ROUTING_PER_REQUEST: _ClassVar[CompositionRouting]
    COMPOSITION_ROUTING_MERGED: _ClassVar[CompositionRouting]
    COMPOSITION_ROUTING_SOFT_TRAJECTORY: _ClassVar[CompositionRouting]
COMPOSITION_ROUTING_UNSPECIFIED: CompositionRouting
COMPOSITION_ROUTING_TOKEN: CompositionRouting
COMPOSITION_ROUTING_PER_REQUEST: CompositionRouting
COMPOSITION_ROUTING_MERGED: CompositionRouting
COMPOSITION_ROUTING_SOFT_TRAJECTORY: CompositionRouting

class AdapterRef(_message.Message):
    __slots__ = ('name', 'uri')
    NAME_FIELD_NUMBER: _ClassVar[int]
    URI_FIELD_NUMBER: _ClassVar[int]
    name: str
    uri: str

    def __init__(self, name: _Optional[str]=..., uri: _Optional[str]=...) -> None:
        ...

class CompositionSpec(_message.Message):
    __slots__ = ('name', 'base_model', 'adapters', 'gates_uri', 'routing')
    NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    GATES_URI_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    name: str
    base_model: str
    adapters: _containers.RepeatedCompositeFieldContainer[AdapterRef]
    gates_uri: str
    routing: CompositionRouting

    def __init__(self, name: _Optional[str]=..., base_model: _Optional[str]=..., adapters: _Optional[_Iterable[_Union[AdapterRef, _Mapping]]]=..., gates_uri: _Optional[str]=..., routing: _Optional[_Union[CompositionRouting, str]]=...) -> None:
        ...

class CompositionInfo(_message.Message):
    __slots__ = ('spec', 'num_layers', 'hidden_size', 'gate_parameters')
    SPEC_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    GATE_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    spec: CompositionSpec
    num_layers: int
    hidden_size: int
    gate_parameters: int

    def __init__(self, spec: _Optional[_Union[CompositionSpec, _Mapping]]=..., num_layers: _Optional[int]=..., hidden_size: _Optional[int]=..., gate_parameters: _Optional[int]=...) -> None:
        ...

class LoadCompositionRequest(_message.Message):
    __slots__ = ('spec',)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: CompositionSpec

    def __init__(self, spec: _Optional[_Union[CompositionSpec, _Mapping]]=...) -> None:
        ...

class LoadCompositionResponse(_message.Message):
    __slots__ = ('composition',)
    COMPOSITION_FIELD_NUMBER: _ClassVar[int]
    composition: CompositionInfo

    def __init__(self, composition: _Optional[_Union[CompositionInfo, _Mapping]]=...) -> None:
        ...

class ListCompositionsRequest(_message.Message):
    __slots__ = ()

    def __init__(self) -> None:
        ...

class ListCompositionsResponse(_message.Message):
    __slots__ = ('compositions',)
    COMPOSITIONS_FIELD_NUMBER: _ClassVar[int]
    compositions: _containers.RepeatedCompositeFieldContainer[CompositionInfo]

    def __init__(self, compositions: _Optional[_Iterable[_Union[CompositionInfo, _Mapping]]]=...) -> None:
        ...

class UnloadCompositionRequest(_message.Message):
    __slots__ = ('name',)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str

    def __init__(self, name: _Optional[str]=...) -> None:
        ...

class UnloadCompositionResponse(_message.Message):
    __slots__ = ()

    def __init__(self) -> None:
        ...

class TokenRoute(_message.Message):
    __slots__ = ('token_id', 'token_text', 'experts')
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_TEXT_FIELD_NUMBER: _ClassVar[int]
    EXPERTS_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token_text: str
    experts: _containers.RepeatedScalarFieldContainer[int]

    def __init__(self, token_id: _Optional[int]=..., token_text: _Optional[str]=..., experts: _Optional[_Iterable[int]]=...) -> None:
        ...

class Usage(_message.Message):
    __slots__ = ('prompt_tokens', 'completion_tokens')
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int

    def __init__(self, prompt_tokens: _Optional[int]=..., completion_tokens: _Optional[int]=...) -> None:
        ...

class GenerateRequest(_message.Message):
    __slots__ = ('model', 'messages', 'tools', 'sampling', 'return_routing_trace')
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTING_TRACE_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolSchema]
    sampling: _types_pb2.SamplingParams
    return_routing_trace: bool

    def __init__(self, model: _Optional[str]=..., messages: _Optional[_Iterable[_Union[_types_pb2.ChatMessage, _Mapping]]]=..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolSchema, _Mapping]]]=..., sampling: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]]=..., return_routing_trace: _Optional[bool]=...) -> None:
        ...

class GenerateResponse(_message.Message):
    __slots__ = ('message', 'finish_reason', 'usage', 'routing_trace')
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_TRACE_FIELD_NUMBER: _ClassVar[int]
    message: _types_pb2.ChatMessage
    finish_reason: str
    usage: Usage
    routing_trace: _containers.RepeatedCompositeFieldContainer[TokenRoute]

    def __init__(self, message: _Optional[_Union[_types_pb2.ChatMessage, _Mapping]]=..., finish_reason: _Optional[str]=..., usage: _Optional[_Union[Usage, _Mapping]]=..., routing_trace: _Optional[_Iterable[_Union[TokenRoute, _Mapping]]]=...) -> None:
        ...

class GenerateStreamRequest(_message.Message):
    __slots__ = ('model', 'messages', 'tools', 'sampling', 'return_routing_trace')
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    RETURN_ROUTING_TRACE_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[_types_pb2.ChatMessage]
    tools: _containers.RepeatedCompositeFieldContainer[_types_pb2.ToolSchema]
    sampling: _types_pb2.SamplingParams
    return_routing_trace: bool

    def __init__(self, model: _Optional[str]=..., messages: _Optional[_Iterable[_Union[_types_pb2.ChatMessage, _Mapping]]]=..., tools: _Optional[_Iterable[_Union[_types_pb2.ToolSchema, _Mapping]]]=..., sampling: _Optional[_Union[_types_pb2.SamplingParams, _Mapping]]=..., return_routing_trace: _Optional[bool]=...) -> None:
        ...

class GenerateStreamResponse(_message.Message):
    __slots__ = ('delta', 'finish_reason', 'message', 'usage', 'routing')
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ROUTING_FIELD_NUMBER: _ClassVar[int]
    delta: str
    finish_reason: str
    message: _types_pb2.ChatMessage
    usage: Usage
    routing: _containers.RepeatedCompositeFieldContainer[TokenRoute]

    def __init__(self, delta: _Optional[str]=..., finish_reason: _Optional[str]=..., message: _Optional[_Union[_types_pb2.ChatMessage, _Mapping]]=..., usage: _Optional[_Union[Usage, _Mapping]]=..., routing: _Optional[_Iterable[_Union[TokenRoute, _Mapping]]]=...) -> None:
        ...