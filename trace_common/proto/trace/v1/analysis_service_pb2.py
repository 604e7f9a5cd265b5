"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/analysis_service.proto')
_sym_db = _symbol_database.Default()
from ...trace.v1 import types_pb2 as trace_dot_v1_dot_types__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n\x1ftrace/v1/analysis_service.proto\x12\x08trace.v1\x1a\x14trace/v1/types.proto"\x86\x02\n\x0cAnalysisSpec\x12\x14\n\x0crollout_uris\x18\x01 \x03(\t\x12#\n\x04mode\x18\x02 \x01(\x0e2\x15.trace.v1.AnalystMode\x12"\n\x03llm\x18\x03 \x01(\x0b2\x15.trace.v1.LlmEndpoint\x12\x10\n\x08num_runs\x18\x04 \x01(\x05\x12\x18\n\x10min_passing_runs\x18\x05 \x01(\x05\x12\x14\n\x0cmin_coverage\x18\x06 \x01(\x01\x12\x0f\n\x07min_gap\x18\x07 \x01(\x01\x12\x16\n\x0emax_candidates\x18\x08 \x01(\x05\x12\x0c\n\x04seed\x18\t \x01(\x03\x12\x1e\n\x16trajectory_char_budget\x18\n \x01(\x05"\xd3\x01\n\x18CreateAnalysisJobRequest\x12$\n\x04spec\x18\x01 \x01(\x0b2\x16.trace.v1.AnalysisSpec\x12\x0e\n\x06run_id\x18\x02 \x01(\t\x12>\n\x06labels\x18\x03 \x03(\x0b2..trace.v1.CreateAnalysisJobRequest.LabelsEntry\x12\x12\n\nrequest_id\x18\x04 \x01(\t\x1a-\n\x0bLabelsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"7\n\x19CreateAnalysisJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"\'\n\x15GetAnalysisJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"\xce\x01\n\x10CapabilityResult\x12(\n\ncapability\x18\x01 \x01(\x0b2\x14.trace.v1.Capability\x12\x10\n\x08retained\x18\x02 \x01(\x08\x12\x14\n\x0cpassing_runs\x18\x03 \x01(\x05\x12\x15\n\rcoverage_mean\x18\x04 \x01(\x01\x12\x14\n\x0ccoverage_std\x18\x05 \x01(\x01\x12\x10\n\x08gap_mean\x18\x06 \x01(\x01\x12\x0f\n\x07gap_std\x18\x07 \x01(\x01\x12\x18\n\x10rejection_reason\x18\x08 \x01(\t"\xc3\x01\n\x16GetAnalysisJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job\x12+\n\x07results\x18\x02 \x03(\x0b2\x1a.trace.v1.CapabilityResult\x12#\n\x04mode\x18\x03 \x01(\x0e2\x15.trace.v1.AnalystMode\x12;\n\x14unexplained_failures\x18\x04 \x01(\x0b2\x1d.trace.v1.UnexplainedFailures"Q\n\x13UnexplainedFailures\x12\x0e\n\x06failed\x18\x01 \x01(\x05\x12\x13\n\x0bby_retained\x18\x02 \x01(\x05\x12\x15\n\rby_candidates\x18\x03 \x01(\x05")\n\x17WatchAnalysisJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"6\n\x18WatchAnalysisJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"e\n\x17ListAnalysisJobsRequest\x12#\n\x06filter\x18\x01 \x01(\x0b2\x13.trace.v1.JobFilter\x12\x11\n\tpage_size\x18\x02 \x01(\x05\x12\x12\n\npage_token\x18\x03 \x01(\t"P\n\x18ListAnalysisJobsResponse\x12\x1b\n\x04jobs\x18\x01 \x03(\x0b2\r.trace.v1.Job\x12\x17\n\x0fnext_page_token\x18\x02 \x01(\t"*\n\x18CancelAnalysisJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"7\n\x19CancelAnalysisJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job*_\n\x0bAnalystMode\x12\x1c\n\x18ANALYST_MODE_UNSPECIFIED\x10\x00\x12\x14\n\x10ANALYST_MODE_LLM\x10\x01\x12\x1c\n\x18ANALYST_MODE_DIAGNOSTICS\x10\x022\xda\x03\n\x0fAnalysisService\x12\\\n\x11CreateAnalysisJob\x12".trace.v1.CreateAnalysisJobRequest\x1a#.trace.v1.CreateAnalysisJobResponse\x12S\n\x0eGetAnalysisJob\x12\x1f.trace.v1.GetAnalysisJobRequest\x1a .trace.v1.GetAnalysisJobResponse\x12[\n\x10WatchAnalysisJob\x12!.trace.v1.WatchAnalysisJobRequest\x1a".trace.v1.WatchAnalysisJobResponse0\x01\x12Y\n\x10ListAnalysisJobs\x12!.trace.v1.ListAnalysisJobsRequest\x1a".trace.v1.ListAnalysisJobsResponse\x12\\\n\x11CancelAnalysisJob\x12".trace.v1.CancelAnalysisJobRequest\x1a#.trace.v1.CancelAnalysisJobResponseb\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.analysis_service_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_CREATEANALYSISJOBREQUEST_LABELSENTRY']._loaded_options = None
    _globals['_CREATEANALYSISJOBREQUEST_LABELSENTRY']._serialized_options = b'8\x01'
    _globals['_ANALYSTMODE']._serialized_start = 1519
    _globals['_ANALYSTMODE']._serialized_end = 1614
    _globals['_ANALYSISSPEC']._serialized_start = 68
    _globals['_ANALYSISSPEC']._serialized_end = 330
    _globals['_CREATEANALYSISJOBREQUEST']._serialized_start = 333
    _globals['_CREATEANALYSISJOBREQUEST']._serialized_end = 544
    _globals['_CREATEANALYSISJOBREQUEST_LABELSENTRY']._serialized_start = 499
    _globals['_CREATEANALYSISJOBREQUEST_LABELSENTRY']._serialized_end = 544
    _globals['_CREATEANALYSISJOBRESPONSE']._serialized_start = 546
    _globals['_CREATEANALYSISJOBRESPONSE']._serialized_end = 601
    _globals['_GETANALYSISJOBREQUEST']._serialized_start = 603
    _globals['_GETANALYSISJOBREQUEST']._serialized_end = 642
    _globals['_CAPABILITYRESULT']._serialized_start = 645
    _globals['_CAPABILITYRESULT']._serialized_end = 851
    _globals['_GETANALYSISJOBRESPONSE']._serialized_start = 854
    _globals['_GETANALYSISJOBRESPONSE']._serialized_end = 1049
    _globals['_UNEXPLAINEDFAILURES']._serialized_start = 1051
    _globals['_UNEXPLAINEDFAILURES']._serialized_end = 1132
    _globals['_WATCHANALYSISJOBREQUEST']._serialized_start = 1134
    _globals['_WATCHANALYSISJOBREQUEST']._serialized_end = 1175
    _globals['_WATCHANALYSISJOBRESPONSE']._serialized_start = 1177
    _globals['_WATCHANALYSISJOBRESPONSE']._serialized_end = 1231
    _globals['_LISTANALYSISJOBSREQUEST']._serialized_start = 1233
    _globals['_LISTANALYSISJOBSREQUEST']._serialized_end = 1334
    _globals['_LISTANALYSISJOBSRESPONSE']._serialized_start = 1336
    _globals['_LISTANALYSISJOBSRESPONSE']._serialized_end = 1416
    _globals['_CANCELANALYSISJOBREQUEST']._serialized_start = 1418
    _globals['_CANCELANALYSISJOBREQUEST']._serialized_end = 1460
    _globals['_CANCELANALYSISJOBRESPONSE']._serialized_start = 1462
    _globals['_CANCELANALYSISJOBRESPONSE']._serialized_end = 1517
    _globals['_ANALYSISSERVICE']._serialized_start = 1617
    _globals['_ANALYSISSERVICE']._serialized_end = 2091