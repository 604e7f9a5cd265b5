"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/types.proto')
_sym_db = _symbol_database.Default()
from google.protobuf import struct_pb2 as google_dot_protobuf_dot_struct__pb2
from google.protobuf import timestamp_pb2 as google_dot_protobuf_dot_timestamp__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n\x14trace/v1/types.proto\x12\x08trace.v1\x1a\x1cgoogle/protobuf/struct.proto\x1a\x1fgoogle/protobuf/timestamp.proto"L\n\x08Progress\x12\x11\n\tcompleted\x18\x01 \x01(\x03\x12\r\n\x05total\x18\x02 \x01(\x03\x12\r\n\x05stage\x18\x03 \x01(\t\x12\x0f\n\x07message\x18\x04 \x01(\t"L\n\x0bArtifactRef\x12\x0b\n\x03uri\x18\x01 \x01(\t\x12\x0e\n\x06sha256\x18\x02 \x01(\t\x12\x12\n\nsize_bytes\x18\x03 \x01(\x03\x12\x0c\n\x04kind\x18\x04 \x01(\t")\n\x08JobError\x12\x0c\n\x04code\x18\x01 \x01(\t\x12\x0f\n\x07message\x18\x02 \x01(\t"\x8d\x04\n\x03Job\x12\x0e\n\x06job_id\x18\x01 \x01(\t\x12\x0c\n\x04kind\x18\x02 \x01(\t\x12!\n\x05state\x18\x03 \x01(\x0e2\x12.trace.v1.JobState\x12$\n\x08progress\x18\x04 \x01(\x0b2\x12.trace.v1.Progress\x12/\n\x0bcreate_time\x18\x05 \x01(\x0b2\x1a.google.protobuf.Timestamp\x12.\n\nstart_time\x18\x06 \x01(\x0b2\x1a.google.protobuf.Timestamp\x12,\n\x08end_time\x18\x07 \x01(\x0b2\x1a.google.protobuf.Timestamp\x12&\n\x07outputs\x18\x08 \x03(\x0b2\x15.trace.v1.ArtifactRef\x12!\n\x05error\x18\t \x01(\x0b2\x12.trace.v1.JobError\x12\x0e\n\x06run_id\x18\n \x01(\t\x12)\n\x06labels\x18\x0b \x03(\x0b2\x19.trace.v1.Job.LabelsEntry\x12+\n\x07metrics\x18\x0c \x03(\x0b2\x1a.trace.v1.Job.MetricsEntry\x1a-\n\x0bLabelsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01\x1a.\n\x0cMetricsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\x01:\x028\x01"?\n\tJobFilter\x12"\n\x06states\x18\x01 \x03(\x0e2\x12.trace.v1.JobState\x12\x0e\n\x06run_id\x18\x02 \x01(\t"\xa1\x01\n\x0eEnvironmentRef\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x0f\n\x07version\x18\x02 \x01(\t\x12\x0b\n\x03uri\x18\x03 \x01(\t\x124\n\x06params\x18\x04 \x03(\x0b2$.trace.v1.EnvironmentRef.ParamsEntry\x1a-\n\x0bParamsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"\xc5\x01\n\tPolicyRef\x12(\n\x07backend\x18\x01 \x01(\x0e2\x17.trace.v1.PolicyBackend\x12\r\n\x05model\x18\x02 \x01(\t\x12\x13\n\x0badapter_uri\x18\x03 \x01(\t\x12\x14\n\x0cadapter_name\x18\x04 \x01(\t\x12\x10\n\x08endpoint\x18\x05 \x01(\t\x12\x17\n\x0fcomposition_uri\x18\x06 \x01(\t\x12\x0f\n\x07routing\x18\x07 \x01(\t\x12\x18\n\x10endpoint_profile\x18\x08 \x01(\t"e\n\x0eSamplingParams\x12\x13\n\x0btemperature\x18\x01 \x01(\x01\x12\r\n\x05top_p\x18\x02 \x01(\x01\x12\r\n\x05top_k\x18\x03 \x01(\x05\x12\x12\n\nmax_tokens\x18\x04 \x01(\x05\x12\x0c\n\x04seed\x18\x05 \x01(\x03"\x86\x01\n\x0bLlmEndpoint\x12\x10\n\x08base_url\x18\x01 \x01(\t\x12\r\n\x05model\x18\x02 \x01(\t\x12\x13\n\x0bapi_key_env\x18\x03 \x01(\t\x12\x17\n\x0ftimeout_seconds\x18\x04 \x01(\x01\x12\x17\n\x0fmax_concurrency\x18\x05 \x01(\x05\x12\x0f\n\x07profile\x18\x06 \x01(\t"<\n\x08ToolCall\x12\n\n\x02id\x18\x01 \x01(\t\x12\x0c\n\x04name\x18\x02 \x01(\t\x12\x16\n\x0earguments_json\x18\x03 \x01(\t"x\n\x0bChatMessage\x12\x0c\n\x04role\x18\x01 \x01(\t\x12\x0f\n\x07content\x18\x02 \x01(\t\x12&\n\ntool_calls\x18\x03 \x03(\x0b2\x12.trace.v1.ToolCall\x12\x14\n\x0ctool_call_id\x18\x04 \x01(\t\x12\x0c\n\x04name\x18\x05 \x01(\t"\x1a\n\nToolSchema\x12\x0c\n\x04json\x18\x01 \x01(\t"Z\n\nCapability\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x13\n\x0bdescription\x18\x02 \x01(\t\x12\x10\n\x08evidence\x18\x03 \x03(\t\x12\x17\n\x0ffailed_task_ids\x18\x04 \x03(\t"1\n\x06Config\x12\'\n\x06values\x18\x01 \x01(\x0b2\x17.google.protobuf.Struct*\x9b\x01\n\x08JobState\x12\x19\n\x15JOB_STATE_UNSPECIFIED\x10\x00\x12\x15\n\x11JOB_STATE_PENDING\x10\x01\x12\x15\n\x11JOB_STATE_RUNNING\x10\x02\x12\x17\n\x13JOB_STATE_SUCCEEDED\x10\x03\x12\x14\n\x10JOB_STATE_FAILED\x10\x04\x12\x17\n\x13JOB_STATE_CANCELLED\x10\x05*\x8b\x01\n\rPolicyBackend\x12\x1e\n\x1aPOLICY_BACKEND_UNSPECIFIED\x10\x00\x12\x1d\n\x19POLICY_BACKEND_IN_PROCESS\x10\x01\x12\x1e\n\x1aPOLICY_BACKEND_OPENAI_HTTP\x10\x02\x12\x1b\n\x17POLICY_BACKEND_SCRIPTED\x10\x03b\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.types_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_JOB_LABELSENTRY']._loaded_options = None
    _globals['_JOB_LABELSENTRY']._serialized_options = b'8\x01'
    _globals['_JOB_METRICSENTRY']._loaded_options = None
    _globals['_JOB_METRICSENTRY']._serialized_options = b'8\x01'
    _globals['_ENVIRONMENTREF_PARAMSENTRY']._loaded_options = None
    _globals['_ENVIRONMENTREF_PARAMSENTRY']._serialized_options = b'8\x01'
    _globals['_JOBSTATE']._serialized_start = 1849
    _globals['_JOBSTATE']._serialized_end = 2004
    _globals['_POLICYBACKEND']._serialized_start = 2007
    _globals['_POLICYBACKEND']._serialized_end = 2146
    _globals['_PROGRESS']._serialized_start = 97
    _globals['_PROGRESS']._serialized_end = 173
    _globals['_ARTIFACTREF']._serialized_start = 175
    _globals['_ARTIFACTREF']._serialized_end = 251
    _globals['_JOBERROR']._serialized_start = 253
    _globals['_JOBERROR']._serialized_end = 294
    _globals['_JOB']._serialized_start = 297
    _globals['_JOB']._serialized_end = 822
    _globals['_JOB_LABELSENTRY']._serialized_start = 729
    _globals['_JOB_LABELSENTRY']._serialized_end = 774
    _globals['_JOB_METRICSENTRY']._serialized_start = 776
    _globals['_JOB_METRICSENTRY']._serialized_end = 822
    _globals['_JOBFILTER']._serialized_start = 824
    _globals['_JOBFILTER']._serialized_end = 887
    _globals['_ENVIRONMENTREF']._serialized_start = 890
    _globals['_ENVIRONMENTREF']._serialized_end = 1051
    _globals['_ENVIRONMENTREF_PARAMSENTRY']._serialized_start = 1006
    _globals['_ENVIRONMENTREF_PARAMSENTRY']._serialized_end = 1051
    _globals['_POLICYREF']._serialized_start = 1054
    _globals['_POLICYREF']._serialized_end = 1251
    _globals['_SAMPLINGPARAMS']._serialized_start = 1253
    _globals['_SAMPLINGPARAMS']._serialized_end = 1354
    _globals['_LLMENDPOINT']._serialized_start = 1357
    _globals['_LLMENDPOINT']._serialized_end = 1491
    _globals['_TOOLCALL']._serialized_start = 1493
    _globals['_TOOLCALL']._serialized_end = 1553
    _globals['_CHATMESSAGE']._serialized_start = 1555
    _globals['_CHATMESSAGE']._serialized_end = 1675
    _globals['_TOOLSCHEMA']._serialized_start = 1677
    _globals['_TOOLSCHEMA']._serialized_end = 1703
    _globals['_CAPABILITY']._serialized_start = 1705
    _globals['_CAPABILITY']._serialized_end = 1795
    _globals['_CONFIG']._serialized_start = 1797
    _globals['_CONFIG']._serialized_end = 1846