-- The SQL surface of pg_uvm_share: create, write, read, grow, checksum, views, drop.
CREATE EXTENSION IF NOT EXISTS pg_uvm_share;

SELECT property FROM uvm.device_info() ORDER BY property;
SELECT value AS provider FROM uvm.device_info() WHERE property = 'provider';
SELECT value::int > 0 AS broker_running FROM uvm.device_info() WHERE property = 'broker_pid';

-- create: returns an id; the first chunk covers the size, rounded to 2 MiB
SELECT uvm.create_segment('api_a', 1000000) > 0 AS created;
SELECT name, owner = current_user AS mine, size, max_size, host_bytes, device_bytes, chunks, generation
  FROM uvm.segments WHERE name = 'api_a';

-- a new segment reads as zeros
SELECT uvm.read_segment('api_a', 0, 8);
SELECT uvm.write_segment('api_a', 100, 'hello, segment'::bytea);
SELECT convert_from(uvm.read_segment('api_a', 100, 14), 'UTF8');
SELECT uvm.read_segment('api_a', 999999, 1), uvm.read_segment('api_a', 1000000, 0);

-- checksum: deterministic, and equal to a recomputation after a no-op rewrite
SELECT uvm.checksum_segment('api_a', 0, 1000000) AS c1 \gset
SELECT uvm.write_segment('api_a', 100, uvm.read_segment('api_a', 100, 14));
SELECT uvm.checksum_segment('api_a', 0, 1000000) = :c1 AS checksum_stable;
SELECT uvm.checksum_segment('api_a', 0, 0) AS empty_checksum;
SELECT uvm.write_segment('api_a', 0, '\x01'::bytea);
SELECT uvm.checksum_segment('api_a', 0, 1000000) <> :c1 AS checksum_changed;

-- grow: small steps add chunks whose sizes double every two chunks (2, 2, 4, 4, 8 MiB ...)
SELECT uvm.grow_segment('api_a', 2097152);   -- covered by the first chunk: no new chunk
SELECT size, chunks, host_bytes FROM uvm.segments WHERE name = 'api_a';
SELECT uvm.grow_segment('api_a', 2097153);
SELECT uvm.grow_segment('api_a', 4194305);
SELECT uvm.grow_segment('api_a', 8388609);
SELECT size, chunks, host_bytes, generation FROM uvm.segments WHERE name = 'api_a';
-- a big growth gets one chunk that covers it
SELECT uvm.grow_segment('api_a', 100000000);
SELECT size, chunks, host_bytes FROM uvm.segments WHERE name = 'api_a';
-- old data survives growth; new space reads as zeros and is writable, across chunk boundaries
SELECT convert_from(uvm.read_segment('api_a', 100, 14), 'UTF8');
SELECT uvm.write_segment('api_a', 2097150, '\xaabbccddeeff'::bytea);
SELECT uvm.read_segment('api_a', 2097148, 10);
SELECT uvm.read_segment('api_a', 99999996, 4);

-- explicit max_size and tier
SELECT uvm.create_segment('api_b', 4096, max_size => 8388608, tier => 'host') > 0 AS created;
SELECT size, max_size, chunks FROM uvm.segments WHERE name = 'api_b';
SELECT uvm.grow_segment('api_b', 8388608);
SELECT size, max_size, host_bytes FROM uvm.segments WHERE name = 'api_b';

-- attach, pin, prefetch
SELECT uvm.attach_segment('api_b') >= 0 AS attached;
SELECT segment, same_address, pins FROM uvm.attachments WHERE pid = pg_backend_pid() AND segment = 'api_b';
SELECT uvm.pin_segment('api_b');
SELECT segment, pins FROM uvm.attachments WHERE pid = pg_backend_pid() AND segment = 'api_b';
SELECT uvm.unpin_segment('api_b'), uvm.unpin_segment('api_b');
SELECT uvm.prefetch_segment('api_b', 0, 4096, 'host');

-- fill: a deterministic pattern of seed and position (a GPU kernel with the CUDA provider)
SELECT uvm.create_segment('api_f', 100) > 0 AS created;
SELECT uvm.fill_segment('api_f', 3, 20, 5);
SELECT uvm.read_segment('api_f', 0, 26);
SELECT uvm.checksum_segment('api_f', 3, 20), uvm.checksum_segment('api_f', 0, 100);
SELECT uvm.drop_segment('api_f');

-- views list what exists
SELECT name, attached_processes FROM uvm.segments WHERE name LIKE 'api_%' ORDER BY name;

SELECT uvm.drop_segment('api_a');
SELECT uvm.drop_segment('api_b');
SELECT count(*) FROM uvm.segments WHERE name LIKE 'api_%';
SELECT count(*) FROM uvm.attachments WHERE pid = pg_backend_pid();

-- function properties: readers are parallel safe, writers are not and are revoked from PUBLIC
SELECT p.proname, p.provolatile, p.proparallel, p.proisstrict,
       has_function_privilege('public', p.oid, 'EXECUTE') AS public_can_execute
  FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
 WHERE n.nspname = 'uvm' ORDER BY p.proname;
