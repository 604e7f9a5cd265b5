"""Generated protocol buffer code."""
from google.protobuf import descriptor as _descriptor
from google.protobuf import descriptor_pool as _descriptor_pool
from google.protobuf import runtime_version as _runtime_version
from google.protobuf import symbol_database as _symbol_database
from google.protobuf.internal import builder as _builder
_runtime_version.ValidateProtobufRuntimeVersion(_runtime_version.Domain.PUBLIC, 7, 35, 1, '', 'trace/v1/trainer_service.proto')
_sym_db = _symbol_database.Default()
from ...trace.v1 import types_pb2 as trace_dot_v1_dot_types__pb2
DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(b'\n\x1etrace/v1/trainer_service.proto\x12\x08trace.v1\x1a\x14trace/v1/types.proto"\xf1\x02\n\x0cTrainingSpec\x12$\n\x04kind\x18\x01 \x01(\x0e2\x16.trace.v1.TrainingKind\x12\x12\n\ncapability\x18\x02 \x01(\t\x12.\n\x0cenvironments\x18\x03 \x03(\x0b2\x18.trace.v1.EnvironmentRef\x12#\n\x06policy\x18\x04 \x01(\x0b2\x13.trace.v1.PolicyRef\x12=\n\x0cadapter_uris\x18\x05 \x03(\x0b2\'.trace.v1.TrainingSpec.AdapterUrisEntry\x12 \n\x06config\x18\x06 \x01(\x0b2\x10.trace.v1.Config\x12$\n\x08executor\x18\x07 \x01(\x0e2\x12.trace.v1.Executor\x12\x17\n\x0fresume_from_uri\x18\x08 \x01(\t\x1a2\n\x10AdapterUrisEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"\xd3\x01\n\x18CreateTrainingJobRequest\x12$\n\x04spec\x18\x01 \x01(\x0b2\x16.trace.v1.TrainingSpec\x12\x0e\n\x06run_id\x18\x02 \x01(\t\x12>\n\x06labels\x18\x03 \x03(\x0b2..trace.v1.CreateTrainingJobRequest.LabelsEntry\x12\x12\n\nrequest_id\x18\x04 \x01(\t\x1a-\n\x0bLabelsEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\t:\x028\x01"7\n\x19CreateTrainingJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"\'\n\x15GetTrainingJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"\x8c\x01\n\x10IterationMetrics\x12\x11\n\titeration\x18\x01 \x01(\x03\x126\n\x06values\x18\x02 \x03(\x0b2&.trace.v1.IterationMetrics.ValuesEntry\x1a-\n\x0bValuesEntry\x12\x0b\n\x03key\x18\x01 \x01(\t\x12\r\n\x05value\x18\x02 \x01(\x01:\x028\x01"k\n\x16GetTrainingJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job\x125\n\x11recent_iterations\x18\x02 \x03(\x0b2\x1a.trace.v1.IterationMetrics")\n\x17WatchTrainingJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"e\n\x18WatchTrainingJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job\x12-\n\titeration\x18\x02 \x01(\x0b2\x1a.trace.v1.IterationMetrics"e\n\x17ListTrainingJobsRequest\x12#\n\x06filter\x18\x01 \x01(\x0b2\x13.trace.v1.JobFilter\x12\x11\n\tpage_size\x18\x02 \x01(\x05\x12\x12\n\npage_token\x18\x03 \x01(\t"P\n\x18ListTrainingJobsResponse\x12\x1b\n\x04jobs\x18\x01 \x03(\x0b2\r.trace.v1.Job\x12\x17\n\x0fnext_page_token\x18\x02 \x01(\t"*\n\x18CancelTrainingJobRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"7\n\x19CancelTrainingJobResponse\x12\x1a\n\x03job\x18\x01 \x01(\x0b2\r.trace.v1.Job"(\n\x16ListCheckpointsRequest\x12\x0e\n\x06job_id\x18\x01 \x01(\t"H\n\nCheckpoint\x12\x11\n\titeration\x18\x01 \x01(\x03\x12\'\n\x08artifact\x18\x02 \x01(\x0b2\x15.trace.v1.ArtifactRef"D\n\x17ListCheckpointsResponse\x12)\n\x0bcheckpoints\x18\x01 \x03(\x0b2\x14.trace.v1.Checkpoint"\xa1\x01\n\x1dValidateTrainingConfigRequest\x12$\n\x04kind\x18\x01 \x01(\x0e2\x16.trace.v1.TrainingKind\x12 \n\x06config\x18\x02 \x01(\x0b2\x10.trace.v1.Config\x12\x12\n\nfield_path\x18\x03 \x01(\t\x12$\n\x08executor\x18\x04 \x01(\x0e2\x12.trace.v1.Executor"B\n\x1eValidateTrainingConfigResponse\x12 \n\x06config\x18\x01 \x01(\x0b2\x10.trace.v1.Config*a\n\x0cTrainingKind\x12\x1d\n\x19TRAINING_KIND_UNSPECIFIED\x10\x00\x12\x19\n\x15TRAINING_KIND_ADAPTER\x10\x01\x12\x17\n\x13TRAINING_KIND_GATES\x10\x02*Q\n\x08Executor\x12\x18\n\x14EXECUTOR_UNSPECIFIED\x10\x00\x12\x12\n\x0eEXECUTOR_LOCAL\x10\x01\x12\x17\n\x13EXECUTOR_KUBERNETES\x10\x022\x9e\x05\n\x0eTrainerService\x12\\\n\x11CreateTrainingJob\x12".trace.v1.CreateTrainingJobRequest\x1a#.trace.v1.CreateTrainingJobResponse\x12S\n\x0eGetTrainingJob\x12\x1f.trace.v1.GetTrainingJobRequest\x1a .trace.v1.GetTrainingJobResponse\x12[\n\x10WatchTrainingJob\x12!.trace.v1.WatchTrainingJobRequest\x1a".trace.v1.WatchTrainingJobResponse0\x01\x12Y\n\x10ListTrainingJobs\x12!.trace.v1.ListTrainingJobsRequest\x1a".trace.v1.ListTrainingJobsResponse\x12\\\n\x11CancelTrainingJob\x12".trace.v1.CancelTrainingJobRequest\x1a#.trace.v1.CancelTrainingJobResponse\x12V\n\x0fListCheckpoints\x12 .trace.v1.ListCheckpointsRequest\x1a!.trace.v1.ListCheckpointsResponse\x12k\n\x16ValidateTrainingConfig\x12\'.trace.v1.ValidateTrainingConfigRequest\x1a(.trace.v1.ValidateTrainingConfigResponseb\x06proto3')
_globals = globals()
_builder.BuildMessageAndEnumDescriptors(DESCRIPTOR, _globals)
_builder.BuildTopDescriptorsAndMessages(DESCRIPTOR, 'trace.v1.trainer_service_pb2', _globals)
if not _descriptor._USE_C_DESCRIPTORS:
    DESCRIPTOR._loaded_options = None
    _globals['_TRAININGSPEC_ADAPTERURISENTRY']._loaded_options = None
    _globals['_TRAININGSPEC_ADAPTERURISENTRY']._serialized_options = b'8\x01'
    _globals['_CREATETRAININGJOBREQUEST_LABELSENTRY']._loaded_options = None
    _globals['_CREATETRAININGJOBREQUEST_LABELSENTRY']._serialized_options = b'8\x01'
    _globals['_ITERATIONMETRICS_VALUESENTRY']._loaded_options = None
    _globals['_ITERATIONMETRICS_VALUESENTRY']._serialized_options = b'8\x01'
    _globals['_TRAININGKIND']._serialized_start = 1852
    _globals['_TRAININGKIND']._serialized_end = 1949
    _globals['_EXECUTOR']._serialized_start = 1951
    _globals['_EXECUTOR']._serialized_end = 2032
    _globals['_TRAININGSPEC']._serialized_start = 67
    _globals['_TRAININGSPEC']._serialized_end = 436
    _globals['_TRAININGSPEC_ADAPTERURISENTRY']._serialized_start = 386
    _globals['_TRAININGSPEC_ADAPTERURISENTRY']._serialized_end = 436
    _globals['_CREATETRAININGJOBREQUEST']._serialized_start = 439
    _globals['_CREATETRAININGJOBREQUEST']._serialized_end = 650
    _globals['_CREATETRAININGJOBREQUEST_LABELSENTRY']._serialized_start = 605
    _globals['_CREATETRAININGJOBREQUEST_LABELSENTRY']._serialized_end = 650
    _globals['_CREATETRAININGJOBRESPONSE']._serialized_start = 652
    _globals['_CREATETRAININGJOBRESPONSE']._serialized_end = 707
    _globals['_GETTRAININGJOBREQUEST']._serialized_start = 709
    _globals['_GETTRAININGJOBREQUEST']._serialized_end = 748
    _globals['_ITERATIONMETRICS']._serialized_start = 751
    _globals['_ITERATIONMETRICS']._serialized_end = 891
    _globals['_ITERATIONMETRICS_VALUESENTRY']._serialized_start = 846
    _globals['_ITERATIONMETRICS_VALUESENTRY']._serialized_end = 891
    _globals['_GETTRAININGJOBRESPONSE']._serialized_start = 893
    _globals['_GETTRAININGJOBRESPONSE']._serialized_end = 1000
    _globals['_WATCHTRAININGJOBREQUEST']._serialized_start = 1002
    _globals['_WATCHTRAININGJOBREQUEST']._serialized_end = 1043
    _globals['_WATCHTRAININGJOBRESPONSE']._serialized_start = 1045
    _globals['_WATCHTRAININGJOBRESPONSE']._serialized_end = 1146
    _globals['_LISTTRAININGJOBSREQUEST']._serialized_start = 1148
    _globals['_LISTTRAININGJOBSREQUEST']._serialized_end = 1249
    _globals['_LISTTRAININGJOBSRESPONSE']._serialized_start = 1251
    _globals['_LISTTRAININGJOBSRESPONSE']._serialized_end = 1331
    _globals['_CANCELTRAININGJOBREQUEST']._serialized_start = 1333
    _globals['_CANCELTRAININGJOBREQUEST']._serialized_end = 1375
    _globals['_CANCELTRAININGJOBRESPONSE']._serialized_start = 1377
    _globals['_CANCELTRAININGJOBRESPONSE']._serialized_end = 1432
    _globals['_LISTCHECKPOINTSREQUEST']._serialized_start = 1434
    _globals['_LISTCHECKPOINTSREQUEST']._serialized_end = 1474
    _globals['_CHECKPOINT']._serialized_start = 1476
    _globals['_CHECKPOINT']._serialized_end = 1548
    _globals['_LISTCHECKPOINTSRESPONSE']._serialized_start = 1550
    _globals['_LISTCHECKPOINTSRESPONSE']._serialized_end = 1618
    _globals['_VALIDATETRAININGCONFIGREQUEST']._serialized_start = 1621
    _globals['_VALIDATETRAININGCONFIGREQUEST']._serialized_end = 1782
    _globals['_VALIDATETRAININGCONFIGRESPONSE']._serialized_start = 1784
    _globals['_VALIDATETRAININGCONFIGRESPONSE']._serialized_end = 1850
    _globals['_TRAINERSERVICE']._serialized_start = 2035
    _globals['_TRAINERSERVICE']._serialized_end = 2705