-- compose.yaml's `scale` profile: the postgres image runs this once, on an empty data folder,
-- as POSTGRES_USER (neurosandbox). The run log and the queue live in the database
-- `neurosandbox` (POSTGRES_DB); Orthanc's index and files in their own database, so that
-- neither schema can meet the other's tables.
CREATE DATABASE orthanc;
