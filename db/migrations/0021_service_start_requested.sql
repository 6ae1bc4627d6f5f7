-- A start the API accepted (202) is visible before the job picks it up: the service reads
-- `starting` from then until the job moves it on (issue 21). start_requested_at is when the last
-- start or restart was accepted; a service whose desired state is running, whose row is still
-- stopped or failed, and whose start was accepted after it last ended, is reported as starting.
ALTER TABLE runtime_services ADD COLUMN start_requested_at timestamptz;
