"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/rollout_service.proto')
_sym_db = _symbol_database.Default()
from ...trace.v1 import types_pb2 as trace_dot_v1_dot_types__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n\x1etrace/v1/rollout_service.proto\x12\x08trace.v1\x1a\x14trace/v1/types.proto"?\n\rTaskSelection\x12\r\n\x05split\x18\x01 \x01(\t\x12\x10\n\x08task_ids\x18\x02 \x03(\t\x12\r\n\x05limit\x18\x03 \x01(\x05"\xdf\x02\n\x0bRolloutSpec\x12-\n\x0benvironment\x18\x01 \x01(\x0b2\x18.trace.v1.EnvironmentRef\x12#\n\x06policy\x18\x02 \x01(\x0b2\x13.trace.v1.PolicyRef\x12&\n\x05tasks\x18\x03 \x01(\x0b2\x17.trace.v1.TaskSelection\x12\x18\n\x10samples_per_task\x18\x04 \x01(\x05\x12*\n\x08sampling\x18\x05 \x01(\x0b2\x18.trace.v1.SamplingParams\x12\x13\n\x0bconcurrency\x18\x06 \x01(\x05\x12\x11\n\tmax_turns\x18\x07 \x01(\x05\x12\x0c\n\x04seed\x18\x08 \x01(\x03\x12-\n\x0euser_simulator\x18\t \x01(\x0b2\x15.trace.v1.LlmEndpoint\x12\x12\n\noutput_uri\x18\n \x01(\t\x12\x15\n\rsystem_prompt\x18\x0b \x01(\t"\xd0\x01\n\x17CreateRolloutJobRequest\x12#\n\x04spec\x18\x01 \x01(\x0b2\x15.trace.v1.RolloutSpec\x12\x0e\n\x06run_id\x18\x02 \x01(\t\x12=\n\x06labels\x18\x03 \x03(\x0b2-.trace.v1.CreateRolloutJobRequest.LabelsEntry\x12\x12\n\nrequest_id\x18\x04 \x01(\t\x1a-\n\x0bLabelsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"6\n\x18CreateRolloutJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"&\n\x14GetRolloutJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"^\n\x15GetRolloutJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job\x12)\n\x07summary\x18\x02 \x01(\x0b2\x18.trace.v1.RolloutSummary"\xa3\x02\n\x0eRolloutSummary\x12\x10\n\x08episodes\x18\x01 \x01(\x03\x12\x11\n\tsuccesses\x18\x02 \x01(\x03\x12\x11\n\tpass_rate\x18\x03 \x01(\x01\x12\x18\n\x10pass_rate_ci_low\x18\x04 \x01(\x01\x12\x19\n\x11pass_rate_ci_high\x18\x05 \x01(\x01\x12\x13\n\x0breward_mean\x18\x06 \x01(\x01\x12\x18\n\x10errored_episodes\x18\x07 \x01(\x03\x12@\n\x0cterminations\x18\x08 \x03(\x0b2*.trace.v1.RolloutSummary.TerminationsEntry\x1a3\n\x11TerminationsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\x03:\x028\x01"(\n\x16WatchRolloutJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"5\n\x17WatchRolloutJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"d\n\x16ListRolloutJobsRequest\x12#\n\x06filter\x18\x01 \x01(\x0b2\x13.trace.v1.JobFilter\x12\x11\n\tpage_size\x18\x02 \x01(\x05\x12\x12\n\npage_token\x18\x03 \x01(\t"O\n\x17ListRolloutJobsResponse\x12\x1b\n\x04jobs\x18\x01 \x03(\x0b2\r.trace.v1.Job\x12\x17\n\x0fnext_page_token\x18\x02 \x01(\t")\n\x17CancelRolloutJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"6\n\x18CancelRolloutJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job" \n\x1eListRolloutEnvironmentsRequest"\xdd\x01\n\x0fEnvironmentInfo\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x0f\n\x07version\x18\x02 \x01(\t\x12\x13\n\x0bdescription\x18\x03 \x01(\t\x12>\n\x0bsplit_sizes\x18\x04 \x03(\x0b2).trace.v1.EnvironmentInfo.SplitSizesEntry\x12#\n\x05tools\x18\x05 \x03(\x0b2\x14.trace.v1.ToolSchema\x1a1\n\x0fSplitSizesEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\x03:\x028\x01"R\n\x1fListRolloutEnvironmentsResponse\x12/\n\x0cenvironments\x18\x01 \x03(\x0b2\x19.trace.v1.EnvironmentInfo2\xba\x04\n\x0eRolloutService\x12Y\n\x10CreateRolloutJob\x12!.trace.v1.CreateRolloutJobRequest\x1a".trace.v1.CreateRolloutJobResponse\x12P\n\rGetRolloutJob\x12\x1e.trace.v1.GetRolloutJobRequest\x1a\x1f.trace.v1.GetRolloutJobResponse\x12X\n\x0fWatchRolloutJob\x12 .trace.v1.WatchRolloutJobRequest\x1a!.trace.v1.WatchRolloutJobResponse0\x01\x12V\n\x0fListRolloutJobs\x12 .trace.v1.ListRolloutJobsRequest\x1a!.trace.v1.ListRolloutJobsResponse\x12Y\n\x10CancelRolloutJob\x12!.trace.v1.CancelRolloutJobRequest\x1a".trace.v1.CancelRolloutJobResponse\x12n\n\x17ListRolloutEnvironments\x12(.trace.v1.ListRolloutEnvironmentsRequest\x1a).trace.v1.ListRolloutEnvironmentsResponseb\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.rollout_service_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_CREATEROLLOUTJOBREQUEST_LABELSENTRY']._loaded_options = None
    _globals['_CREATEROLLOUTJOBREQUEST_LABELSENTRY']._serialized_options = b'8\x01'
    _globals['_ROLLOUTSUMMARY_TERMINATIONSENTRY']._loaded_options = None
    _globals['_ROLLOUTSUMMARY_TERMINATIONSENTRY']._serialized_options = b'8\x01'
    _globals['_ENVIRONMENTINFO_SPLITSIZESENTRY']._loaded_options = None
    _globals['_ENVIRONMENTINFO_SPLITSIZESENTRY']._serialized_options = b'8\x01'
    _globals['_TASKSELECTION']._serialized_start = 66
    _globals['_TASKSELECTION']._serialized_end = 129
    _globals['_ROLLOUTSPEC']._serialized_start = 132
    _globals['_ROLLOUTSPEC']._serialized_end = 483
    _globals['_CREATEROLLOUTJOBREQUEST']._serialized_start = 486
    _globals['_CREATEROLLOUTJOBREQUEST']._serialized_end = 694
    _globals['_CREATEROLLOUTJOBREQUEST_LABELSENTRY']._serialized_start = 649
    _globals['_CREATEROLLOUTJOBREQUEST_LABELSENTRY']._serialized_end = 694
    _globals['_CREATEROLLOUTJOBRESPONSE']._serialized_start = 696
    _globals['_CREATEROLLOUTJOBRESPONSE']._serialized_end = 750
    _globals['_GETROLLOUTJOBREQUEST']._serialized_start = 752
    _globals['_GETROLLOUTJOBREQUEST']._serialized_end = 790
    _globals['_GETROLLOUTJOBRESPONSE']._serialized_start = 792
    _globals['_GETROLLOUTJOBRESPONSE']._serialized_end = 886
    _globals['_ROLLOUTSUMMARY']._serialized_start = 889
    _globals['_ROLLOUTSUMMARY']._serialized_end = 1180
    _globals['_ROLLOUTSUMMARY_TERMINATIONSENTRY']._serialized_start = 1129
    _globals['_ROLLOUTSUMMARY_TERMINATIONSENTRY']._serialized_end = 1180
    _globals['_WATCHROLLOUTJOBREQUEST']._serialized_start = 1182
    _globals['_WATCHROLLOUTJOBREQUEST']._serialized_end = 1222
    _globals['_WATCHROLLOUTJOBRESPONSE']._serialized_start = 1224
    _globals['_WATCHROLLOUTJOBRESPONSE']._serialized_end = 1277
    _globals['_LISTROLLOUTJOBSREQUEST']._serialized_start = 1279
    _globals['_LISTROLLOUTJOBSREQUEST']._serialized_end = 1379
    _globals['_LISTROLLOUTJOBSRESPONSE']._serialized_start = 1381
    _globals['_LISTROLLOUTJOBSRESPONSE']._serialized_end = 1460
    _globals['_CANCELROLLOUTJOBREQUEST']._serialized_start = 1462
    _globals['_CANCELROLLOUTJOBREQUEST']._serialized_end = 1503
    _globals['_CANCELROLLOUTJOBRESPONSE']._serialized_start = 1505
    _globals['_CANCELROLLOUTJOBRESPONSE']._serialized_end = 1559
    _globals['_LISTROLLOUTENVIRONMENTSREQUEST']._serialized_start = 1561
    _globals['_LISTROLLOUTENVIRONMENTSREQUEST']._serialized_end = 1593
    _globals['_ENVIRONMENTINFO']._serialized_start = 1596
    _globals['_ENVIRONMENTINFO']._serialized_end = 1817
    _globals['_ENVIRONMENTINFO_SPLITSIZESENTRY']._serialized_start = 1768
    _globals['_ENVIRONMENTINFO_SPLITSIZESENTRY']._serialized_end = 1817
    _globals['_LISTROLLOUTENVIRONMENTSRESPONSE']._serialized_start = 1819
    _globals['_LISTROLLOUTENVIRONMENTSRESPONSE']._serialized_end = 1901
    _globals['_ROLLOUTSERVICE']._serialized_start = 1904
    _globals['_ROLLOUTSERVICE']._serialized_end = 2474