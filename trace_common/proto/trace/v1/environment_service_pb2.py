"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/environment_service.proto')
_sym_db = _symbol_database.Default()
from ...trace.v1 import types_pb2 as trace_dot_v1_dot_types__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n"trace/v1/environment_service.proto\x12\x08trace.v1\x1a\x14trace/v1/types.proto"\xc8\x03\n\x0eGenerationSpec\x12*\n\x0ccapabilities\x18\x01 \x03(\x0b2\x14.trace.v1.Capability\x12(\n\x06target\x18\x02 \x01(\x0b2\x18.trace.v1.EnvironmentRef\x12&\n\x04mode\x18\x03 \x01(\x0e2\x18.trace.v1.GenerationMode\x12"\n\x03llm\x18\x04 \x01(\x0b2\x15.trace.v1.LlmEndpoint\x12\x13\n\x0bmax_retries\x18\x05 \x01(\x05\x12/\n\x12calibration_policy\x18\x06 \x01(\x0b2\x13.trace.v1.PolicyRef\x12\x1e\n\x16calibration_reward_min\x18\x07 \x01(\x01\x12\x1e\n\x16calibration_reward_max\x18\x08 \x01(\x01\x12\x0c\n\x04seed\x18\t \x01(\x03\x12(\n\x1bcalibration_min_informative\x18\n \x01(\x01H\x00\x88\x01\x01\x126\n\x14calibration_sampling\x18\x0b \x01(\x0b2\x18.trace.v1.SamplingParamsB\x1e\n\x1c_calibration_min_informative"\xd9\x01\n\x1aCreateGenerationJobRequest\x12&\n\x04spec\x18\x01 \x01(\x0b2\x18.trace.v1.GenerationSpec\x12\x0e\n\x06run_id\x18\x02 \x01(\t\x12@\n\x06labels\x18\x03 \x03(\x0b20.trace.v1.CreateGenerationJobRequest.LabelsEntry\x12\x12\n\nrequest_id\x18\x04 \x01(\t\x1a-\n\x0bLabelsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"9\n\x1bCreateGenerationJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job")\n\x17GetGenerationJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"i\n\x18GetGenerationJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job\x121\n\x0cenvironments\x18\x02 \x03(\x0b2\x1b.trace.v1.EnvironmentRecord"\xd7\x02\n\x11EnvironmentRecord\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x0f\n\x07version\x18\x02 \x01(\t\x12\x12\n\ncapability\x18\x03 \x01(\t\x12&\n\x04mode\x18\x04 \x01(\x0e2\x18.trace.v1.GenerationMode\x12*\n\x06status\x18\x05 \x01(\x0e2\x1a.trace.v1.ValidationStatus\x12#\n\x04code\x18\x06 \x01(\x0b2\x15.trace.v1.ArtifactRef\x120\n\x11validation_report\x18\x07 \x01(\x0b2\x15.trace.v1.ArtifactRef\x12\x19\n\x11rejection_reasons\x18\x08 \x03(\t\x12\x1f\n\x17calibration_reward_mean\x18\t \x01(\x01\x12(\n calibration_informative_fraction\x18\n \x01(\x01"+\n\x19WatchGenerationJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"8\n\x1aWatchGenerationJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"g\n\x19ListGenerationJobsRequest\x12#\n\x06filter\x18\x01 \x01(\x0b2\x13.trace.v1.JobFilter\x12\x11\n\tpage_size\x18\x02 \x01(\x05\x12\x12\n\npage_token\x18\x03 \x01(\t"R\n\x1aListGenerationJobsResponse\x12\x1b\n\x04jobs\x18\x01 \x03(\x0b2\r.trace.v1.Job\x12\x17\n\x0fnext_page_token\x18\x02 \x01(\t",\n\x1aCancelGenerationJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"9\n\x1bCancelGenerationJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"G\n\x17ListEnvironmentsRequest\x12\x12\n\ncapability\x18\x01 \x01(\t\x12\x18\n\x10include_rejected\x18\x02 \x01(\x08"M\n\x18ListEnvironmentsResponse\x121\n\x0cenvironments\x18\x01 \x03(\x0b2\x1b.trace.v1.EnvironmentRecord"6\n\x15GetEnvironmentRequest\x12\x0c\n\x04name\x18\x01 \x01(\t\x12\x0f\n\x07version\x18\x02 \x01(\t"o\n\x16GetEnvironmentResponse\x120\n\x0benvironment\x18\x01 \x01(\x0b2\x1b.trace.v1.EnvironmentRecord\x12#\n\x05tools\x18\x02 \x03(\x0b2\x14.trace.v1.ToolSchema"R\n\x13ResetEpisodeRequest\x12-\n\x0benvironment\x18\x01 \x01(\x0b2\x18.trace.v1.EnvironmentRef\x12\x0c\n\x04seed\x18\x02 \x01(\x03"\x8a\x01\n\x14ResetEpisodeResponse\x12\x12\n\nepisode_id\x18\x01 \x01(\t\x12\'\n\x08messages\x18\x02 \x03(\x0b2\x15.trace.v1.ChatMessage\x12#\n\x05tools\x18\x03 \x03(\x0b2\x14.trace.v1.ToolSchema\x12\x10\n\x08guidance\x18\x04 \x01(\t"n\n\x12StepEpisodeRequest\x12\x12\n\nepisode_id\x18\x01 \x01(\t\x12\'\n\ttool_call\x18\x02 \x01(\x0b2\x12.trace.v1.ToolCallH\x00\x12\x11\n\x07message\x18\x03 \x01(\tH\x00B\x08\n\x06action"y\n\x13StepEpisodeResponse\x12*\n\x0bobservation\x18\x01 \x01(\x0b2\x15.trace.v1.ChatMessage\x12\x0c\n\x04done\x18\x02 \x01(\x08\x12\x0e\n\x06reward\x18\x03 \x01(\x01\x12\x18\n\x10diagnostics_json\x18\x04 \x03(\t")\n\x13CloseEpisodeRequest\x12\x12\n\nepisode_id\x18\x01 \x01(\t"\x16\n\x14CloseEpisodeResponse*g\n\x0eGenerationMode\x12\x1f\n\x1bGENERATION_MODE_UNSPECIFIED\x10\x00\x12\x1b\n\x17GENERATION_MODE_LIBRARY\x10\x01\x12\x17\n\x13GENERATION_MODE_LLM\x10\x02*u\n\x10ValidationStatus\x12!\n\x1dVALIDATION_STATUS_UNSPECIFIED\x10\x00\x12\x1e\n\x1aVALIDATION_STATUS_ACCEPTED\x10\x01\x12\x1e\n\x1aVALIDATION_STATUS_REJECTED\x10\x022\x95\x07\n\x12EnvironmentService\x12b\n\x13CreateGenerationJob\x12$.trace.v1.CreateGenerationJobRequest\x1a%.trace.v1.CreateGenerationJobResponse\x12Y\n\x10GetGenerationJob\x12!.trace.v1.GetGenerationJobRequest\x1a".trace.v1.GetGenerationJobResponse\x12a\n\x12WatchGenerationJob\x12#.trace.v1.WatchGenerationJobRequest\x1a$.trace.v1.WatchGenerationJobResponse0\x01\x12_\n\x12ListGenerationJobs\x12#.trace.v1.ListGenerationJobsRequest\x1a$.trace.v1.ListGenerationJobsResponse\x12b\n\x13CancelGenerationJob\x12$.trace.v1.CancelGenerationJobRequest\x1a%.trace.v1.CancelGenerationJobResponse\x12Y\n\x10ListEnvironments\x12!.trace.v1.ListEnvironmentsRequest\x1a".trace.v1.ListEnvironmentsResponse\x12S\n\x0eGetEnvironment\x12\x1f.trace.v1.GetEnvironmentRequest\x1a .trace.v1.GetEnvironmentResponse\x12M\n\x0cResetEpisode\x12\x1d.trace.v1.ResetEpisodeRequest\x1a\x1e.trace.v1.ResetEpisodeResponse\x12J\n\x0bStepEpisode\x12\x1c.trace.v1.StepEpisodeRequest\x1a\x1d.trace.v1.StepEpisodeResponse\x12M\n\x0cCloseEpisode\x12\x1d.trace.v1.CloseEpisodeRequest\x1a\x1e.trace.v1.CloseEpisodeResponseb\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.environment_service_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_CREATEGENERATIONJOBREQUEST_LABELSENTRY']._loaded_options = None
    _globals['_CREATEGENERATIONJOBREQUEST_LABELSENTRY']._serialized_options = b'8\x01'
    _globals['_GENERATIONMODE']._serialized_start = 2549
    _globals['_GENERATIONMODE']._serialized_end = 2652
    _globals['_VALIDATIONSTATUS']._serialized_start = 2654
    _globals['_VALIDATIONSTATUS']._serialized_end = 2771
    _globals['_GENERATIONSPEC']._serialized_start = 71
    _globals['_GENERATIONSPEC']._serialized_end = 527
    _globals['_CREATEGENERATIONJOBREQUEST']._serialized_start = 530
    _globals['_CREATEGENERATIONJOBREQUEST']._serialized_end = 747
    _globals['_CREATEGENERATIONJOBREQUEST_LABELSENTRY']._serialized_start = 702
    _globals['_CREATEGENERATIONJOBREQUEST_LABELSENTRY']._serialized_end = 747
    _globals['_CREATEGENERATIONJOBRESPONSE']._serialized_start = 749
    _globals['_CREATEGENERATIONJOBRESPONSE']._serialized_end = 806
    _globals['_GETGENERATIONJOBREQUEST']._serialized_start = 808
    _globals['_GETGENERATIONJOBREQUEST']._serialized_end = 849
    _globals['_GETGENERATIONJOBRESPONSE']._serialized_start = 851
    _globals['_GETGENERATIONJOBRESPONSE']._serialized_end = 956
    _globals['_ENVIRONMENTRECORD']._serialized_start = 959
    _globals['_ENVIRONMENTRECORD']._serialized_end = 1302
    _globals['_WATCHGENERATIONJOBREQUEST']._serialized_start = 1304
    _globals['_WATCHGENERATIONJOBREQUEST']._serialized_end = 1347
    _globals['_WATCHGENERATIONJOBRESPONSE']._serialized_start = 1349
    _globals['_WATCHGENERATIONJOBRESPONSE']._serialized_end = 1405
    _globals['_LISTGENERATIONJOBSREQUEST']._serialized_start = 1407
    _globals['_LISTGENERATIONJOBSREQUEST']._serialized_end = 1510
    _globals['_LISTGENERATIONJOBSRESPONSE']._serialized_start = 1512
    _globals['_LISTGENERATIONJOBSRESPONSE']._serialized_end = 1594
    _globals['_CANCELGENERATIONJOBREQUEST']._serialized_start = 1596
    _globals['_CANCELGENERATIONJOBREQUEST']._serialized_end = 1640
    _globals['_CANCELGENERATIONJOBRESPONSE']._serialized_start = 1642
    _globals['_CANCELGENERATIONJOBRESPONSE']._serialized_end = 1699
    _globals['_LISTENVIRONMENTSREQUEST']._serialized_start = 1701
    _globals['_LISTENVIRONMENTSREQUEST']._serialized_end = 1772
    _globals['_LISTENVIRONMENTSRESPONSE']._serialized_start = 1774
    _globals['_LISTENVIRONMENTSRESPONSE']._serialized_end = 1851
    _globals['_GETENVIRONMENTREQUEST']._serialized_start = 1853
    _globals['_GETENVIRONMENTREQUEST']._serialized_end = 1907
    _globals['_GETENVIRONMENTRESPONSE']._serialized_start = 1909
    _globals['_GETENVIRONMENTRESPONSE']._serialized_end = 2020
    _globals['_RESETEPISODEREQUEST']._serialized_start = 2022
    _globals['_RESETEPISODEREQUEST']._serialized_end = 2104
    _globals['_RESETEPISODERESPONSE']._serialized_start = 2107
    _globals['_RESETEPISODERESPONSE']._serialized_end = 2245
    _globals['_STEPEPISODEREQUEST']._serialized_start = 2247
    _globals['_STEPEPISODEREQUEST']._serialized_end = 2357
    _globals['_STEPEPISODERESPONSE']._serialized_start = 2359
    _globals['_STEPEPISODERESPONSE']._serialized_end = 2480
    _globals['_CLOSEEPISODEREQUEST']._serialized_start = 2482
    _globals['_CLOSEEPISODEREQUEST']._serialized_end = 2523
    _globals['_CLOSEEPISODERESPONSE']._serialized_start = 2525
    _globals['_CLOSEEPISODERESPONSE']._serialized_end = 2547
    _globals['_ENVIRONMENTSERVICE']._serialized_start = 2774
    _globals['_ENVIRONMENTSERVICE']._serialized_end = 3691