"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/inference_service.proto')
_sym_db = _symbol_database.Default()
from ...trace.v1 import types_pb2 as trace_dot_v1_dot_types__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n trace/v1/inference_service.proto\x12\x08trace.v1\x1a\x14trace/v1/types.proto"\'\n\nAdapterRef\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x0b\n\x03uri\x18\x02 \x01(\t"\x9d\x01\n\x0fCompositionSpec\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x12\n\nbase_model\x18\x02 \x01(\t\x12&\n\x08adapters\x18\x03 \x03(\x0b2\x14.trace.v1.AdapterRef\x12\x11\n\tgates_uri\x18\x04 \x01(\t\x12-\n\x07routing\x18\x05 \x01(\x0e2\x1c.trace.v1.CompositionRouting"|\n\x0fCompositionInfo\x12\'\n\x04spec\x18\x01 \x01(\x0b2\x19.trace.v1.CompositionSpec\x12\x12\n\nnum_layers\x18\x02 \x01(\x05\x12\x13\n\x0bhidden_size\x18\x03 \x01(\x05\x12\x17\n\x0fgate_parameters\x18\x04 \x01(\x03"A\n\x16LoadCompositionRequest\x12\'\n\x04spec\x18\x01 \x01(\x0b2\x19.trace.v1.CompositionSpec"I\n\x17LoadCompositionResponse\x12.\n\x0bcomposition\x18\x01 \x01(\x0b2\x19.trace.v1.CompositionInfo"\x19\n\x17ListCompositionsRequest"K\n\x18ListCompositionsResponse\x12/\n\x0ccompositions\x18\x01 \x03(\x0b2\x19.trace.v1.CompositionInfo"(\n\x18UnloadCompositionRequest\x12\x0c\n\x04name\x18\x01 \x01(\t"\x1b\n\x19UnloadCompositionResponse"C\n\nTokenRoute\x12\x10\n\x08token_id\x18\x01 \x01(\x05\x12\x12\n\ntoken_text\x18\x02 \x01(\t\x12\x0f\n\x07experts\x18\x03 \x03(\x05"9\n\x05Usage\x12\x15\n\rprompt_tokens\x18\x01 \x01(\x05\x12\x19\n\x11completion_tokens\x18\x02 \x01(\x05"\xb8\x01\n\x0fGenerateRequest\x12\r\n\x05model\x18\x01 \x01(\t\x12\'\n\x08messages\x18\x02 \x03(\x0b2\x15.trace.v1.ChatMessage\x12#\n\x05tools\x18\x03 \x03(\x0b2\x14.trace.v1.ToolSchema\x12*\n\x08sampling\x18\x04 \x01(\x0b2\x18.trace.v1.SamplingParams\x12\x1c\n\x14return_routing_trace\x18\x05 \x01(\x08"\x9e\x01\n\x10GenerateResponse\x12&\n\x07message\x18\x01 \x01(\x0b2\x15.trace.v1.ChatMessage\x12\x15\n\rfinish_reason\x18\x02 \x01(\t\x12\x1e\n\x05usage\x18\x03 \x01(\x0b2\x0f.trace.v1.Usage\x12+\n\rrouting_trace\x18\x04 \x03(\x0b2\x14.trace.v1.TokenRoute"\xbe\x01\n\x15GenerateStreamRequest\x12\r\n\x05model\x18\x01 \x01(\t\x12\'\n\x08messages\x18\x02 \x03(\x0b2\x15.trace.v1.ChatMessage\x12#\n\x05tools\x18\x03 \x03(\x0b2\x14.trace.v1.ToolSchema\x12*\n\x08sampling\x18\x04 \x01(\x0b2\x18.trace.v1.SamplingParams\x12\x1c\n\x14return_routing_trace\x18\x05 \x01(\x08"\xad\x01\n\x16GenerateStreamResponse\x12\r\n\x05delta\x18\x01 \x01(\t\x12\x15\n\rfinish_reason\x18\x02 \x01(\t\x12&\n\x07message\x18\x03 \x01(\x0b2\x15.trace.v1.ChatMessage\x12\x1e\n\x05usage\x18\x04 \x01(\x0b2\x0f.trace.v1.Usage\x12%\n\x07routing\x18\x05 \x03(\x0b2\x14.trace.v1.TokenRoute*\xc6\x01\n\x12CompositionRouting\x12#\n\x1fCOMPOSITION_ROUTING_UNSPECIFIED\x10\x00\x12\x1d\n\x19COMPOSITION_ROUTING_TOKEN\x10\x01\x12#\n\x1fCOMPOSITION_ROUTING_PER_REQUEST\x10\x02\x12\x1e\n\x1aCOMPOSITION_ROUTING_MERGED\x10\x03\x12\'\n#COMPOSITION_ROUTING_SOFT_TRAJECTORY\x10\x042\xbd\x03\n\x10InferenceService\x12V\n\x0fLoadComposition\x12 .trace.v1.LoadCompositionRequest\x1a!.trace.v1.LoadCompositionResponse\x12Y\n\x10ListCompositions\x12!.trace.v1.ListCompositionsRequest\x1a".trace.v1.ListCompositionsResponse\x12\\\n\x11UnloadComposition\x12".trace.v1.UnloadCompositionRequest\x1a#.trace.v1.UnloadCompositionResponse\x12A\n\x08Generate\x12\x19.trace.v1.GenerateRequest\x1a\x1a.trace.v1.GenerateResponse\x12U\n\x0eGenerateStream\x12\x1f.trace.v1.GenerateStreamRequest\x1a .trace.v1.GenerateStreamResponse0\x01b\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.inference_service_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_COMPOSITIONROUTING']._serialized_start = 1558
    _globals['_COMPOSITIONROUTING']._serialized_end = 1756
    _globals['_ADAPTERREF']._serialized_start = 68
    _globals['_ADAPTERREF']._serialized_end = 107
    _globals['_COMPOSITIONSPEC']._serialized_start = 110
    _globals['_COMPOSITIONSPEC']._serialized_end = 267
    _globals['_COMPOSITIONINFO']._serialized_start = 269
    _globals['_COMPOSITIONINFO']._serialized_end = 393
    _globals['_LOADCOMPOSITIONREQUEST']._serialized_start = 395
    _globals['_LOADCOMPOSITIONREQUEST']._serialized_end = 460
    _globals['_LOADCOMPOSITIONRESPONSE']._serialized_start = 462
    _globals['_LOADCOMPOSITIONRESPONSE']._serialized_end = 535
    _globals['_LISTCOMPOSITIONSREQUEST']._serialized_start = 537
    _globals['_LISTCOMPOSITIONSREQUEST']._serialized_end = 562
    _globals['_LISTCOMPOSITIONSRESPONSE']._serialized_start = 564
    _globals['_LISTCOMPOSITIONSRESPONSE']._serialized_end = 639
    _globals['_UNLOADCOMPOSITIONREQUEST']._serialized_start = 641
    _globals['_UNLOADCOMPOSITIONREQUEST']._serialized_end = 681
    _globals['_UNLOADCOMPOSITIONRESPONSE']._serialized_start = 683
    _globals['_UNLOADCOMPOSITIONRESPONSE']._serialized_end = 710
    _globals['_TOKENROUTE']._serialized_start = 712
    _globals['_TOKENROUTE']._serialized_end = 779
    _globals['_USAGE']._serialized_start = 781
    _globals['_USAGE']._serialized_end = 838
    _globals['_GENERATEREQUEST']._serialized_start = 841
    _globals['_GENERATEREQUEST']._serialized_end = 1025
    _globals['_GENERATERESPONSE']._serialized_start = 1028
    _globals['_GENERATERESPONSE']._serialized_end = 1186
    _globals['_GENERATESTREAMREQUEST']._serialized_start = 1189
    _globals['_GENERATESTREAMREQUEST']._serialized_end = 1379
    _globals['_GENERATESTREAMRESPONSE']._serialized_start = 1382
    _globals['_GENERATESTREAMRESPONSE']._serialized_end = 1555
    _globals['_INFERENCESERVICE']._serialized_start = 1759
    _globals['_INFERENCESERVICE']._serialized_end = 2204