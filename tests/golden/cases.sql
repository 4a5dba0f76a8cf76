-- Workloads of the golden cases, as run by tools/capture_golden.py on the newest version
-- (all_types has an xml column only where the server was built with libxml).
-- ===== case: types =====
-- [setup]
CREATE TYPE mood AS ENUM ('sad', 'happy', 'so-so', 'with "quote"', 'it''s');
-- [setup]
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
-- [setup]
CREATE TYPE pair AS (a int, b text);
-- [setup]
CREATE SCHEMA "My Schema";
-- [setup]
CREATE TYPE "My Schema".color AS ENUM ('red', 'green', 'blue');
-- [setup]
CREATE TABLE "My Schema"."odd.table" ("a b" int PRIMARY KEY, "x""y" text, "Δ" numeric);
-- [setup]
CREATE TABLE all_types (
    id int PRIMARY KEY,
    c_bool bool, c_int2 int2, c_int4 int4, c_int8 int8,
    c_numeric numeric, c_numeric_p numeric(38,10), c_float4 float4, c_float8 float8,
    c_text text, c_varchar varchar(20), c_char char(5), c_name name, c_bytea bytea,
    c_date date, c_time time, c_timetz timetz, c_ts timestamp, c_tstz timestamptz, c_ts3 timestamp(3),
    c_interval interval, c_uuid uuid, c_money money, c_bit bit(4), c_varbit varbit, c_oid oid,
    c_inet inet, c_cidr cidr, c_macaddr macaddr,
    c_point point, c_box box, c_lseg lseg, c_circle circle, c_polygon polygon, c_path path,
    c_tsvector tsvector, c_int4range int4range, c_tstzrange tstzrange,
    c_json json, c_jsonb jsonb,
    c_int_arr int[], c_text_arr text[], c_int_2d int[], c_lb_arr int[], c_jsonb_arr jsonb[],
    c_numeric_arr numeric[], c_bool_arr bool[], c_tstz_arr timestamptz[], c_box_arr box[], c_float8_arr float8[],
    c_enum mood, c_domain posint, c_comp pair, c_comp_q pair, c_enum_arr mood[], c_other "My Schema".color
);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO all_types (id, c_bool, c_int2, c_int4, c_int8, c_numeric, c_numeric_p, c_float4, c_float8, c_text, c_varchar, c_char, c_name, c_bytea, c_date, c_time, c_timetz, c_ts, c_tstz, c_ts3, c_interval, c_uuid, c_money, c_bit, c_varbit, c_oid, c_inet, c_cidr, c_macaddr, c_point, c_box, c_lseg, c_circle, c_polygon, c_path, c_tsvector, c_int4range, c_tstzrange, c_json, c_jsonb, c_int_arr, c_text_arr, c_int_2d, c_lb_arr, c_jsonb_arr, c_numeric_arr, c_bool_arr, c_tstz_arr, c_box_arr, c_float8_arr, c_enum, c_domain, c_comp, c_comp_q, c_enum_arr, c_other) VALUES (1, true, 12, -34, 5678901234, 3.14159, 12345.6789, 1.5, -2.25e-10, 'hello', 'varchar', 'ab', 'name', '\xdeadbeef', '2026-01-02', '03:04:05.123456', '03:04:05+02', '2026-01-02 03:04:05.123', '2026-01-02 03:04:05.123+05:30', '2026-01-02 03:04:05.123456', '1 year 2 mons 3 days 04:05:06.789', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 1234.56, B'1010', B'101', 4294967295, '192.168.1.5/24', '10.0.0.0/8', '08:00:2b:01:02:03', '(1.5,-2)', '((0,0),(1,1))', '[(0,0),(1,1)]', '<(0,0),2>', '((0,0),(1,0),(0,1))', '[(0,0),(1,1),(2,0)]', 'a fat cat', '[1,10)', '[2026-01-01,2026-02-01)', '{"a": [1, 2.5, "x"], "b": {"c": null}}', '{"a": [1, 2.5, "x"], "b": {"c": null}}', '{1,2,3}', '{a,b}', '{{1,2},{3,4}}', '[0:1]={1,2}', ARRAY['{"k": 1}'::jsonb, 'null'], '{1.5,NaN,-0.001}', '{t,f,NULL}', '{"2026-01-02 03:04:05+00",infinity}', '{(1,1),(0,0);(2,2),(1,1)}', '{1.5,NaN,Infinity,-Infinity,-0}', 'happy', 42, ROW(1, 'one'), ROW(2, 'it''s "q" \ ,()'), '{sad,happy}', 'red');
-- [main]
INSERT INTO all_types (id) VALUES (2);
-- [main]
INSERT INTO all_types (id, c_bool, c_int2, c_int4, c_int8, c_numeric, c_numeric_p, c_float4, c_float8, c_text, c_varchar, c_char, c_name, c_bytea, c_date, c_time, c_timetz, c_ts, c_tstz, c_ts3, c_interval, c_uuid, c_money, c_bit, c_varbit, c_oid, c_inet, c_cidr, c_macaddr, c_point, c_tsvector, c_int4range, c_tstzrange, c_json, c_jsonb, c_int_arr, c_text_arr, c_int_2d, c_lb_arr, c_jsonb_arr, c_numeric_arr, c_bool_arr, c_tstz_arr, c_box_arr, c_float8_arr, c_enum, c_domain, c_comp, c_comp_q, c_enum_arr, c_other) VALUES (3, false, -32768, -2147483648, -9223372036854775808, 'NaN', -9999999999999999999999999999.9999999999, '-Infinity', '-0', '', '', '', '', '\x', '-infinity', '00:00:00', '23:59:59.999999-12', '-infinity', '-infinity', '-infinity', '-1 day -1 second', '00000000-0000-0000-0000-000000000000', -0.01, B'0000', B'', 0, '::1', '2001:db8::/32', '00:00:00:00:00:00', '(0,0)', '', 'empty', '(,)', 'null', 'null', '{}', '{}', '{}', '[-2:-1]={-1,-2}', '{}', '{}', '{}', '{-infinity}', '{}', '{}', 'sad', 1, ROW(NULL, NULL), ROW(NULL, ''), '{}', 'green');
-- [main]
INSERT INTO all_types (id, c_bool, c_int2, c_int4, c_int8, c_numeric, c_numeric_p, c_float4, c_float8, c_text, c_varchar, c_char, c_name, c_bytea, c_date, c_time, c_timetz, c_ts, c_tstz, c_ts3, c_interval, c_uuid, c_money, c_bit, c_varbit, c_oid, c_inet, c_cidr, c_macaddr, c_box, c_tsvector, c_int4range, c_tstzrange, c_json, c_jsonb, c_int_arr, c_text_arr, c_int_2d, c_lb_arr, c_jsonb_arr, c_numeric_arr, c_bool_arr, c_tstz_arr, c_box_arr, c_float8_arr, c_enum, c_domain, c_comp, c_comp_q, c_enum_arr, c_other) VALUES (4, true, 32767, 2147483647, 9223372036854775807, 'Infinity', 9999999999999999999999999999.9999999999, 'Infinity', 'NaN', E'unicode é ü 中文 😀 quotes '' " backslash \\ newline\n tab\t cr\r end', 'ünïcödé 😀', 'ñ😀', 'Ωmega', '\x00ff00', 'infinity', '24:00:00', '24:00:00+15:59', 'infinity', 'infinity', 'infinity', '178000000 years', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 92233720368547758.07, B'1111', B'1010101010101', 1, '2001:db8::1/64', '192.168.0.0/16', 'ff:ff:ff:ff:ff:ff', '((-1.5,-2.5),(1e+300,3))', E'''quoted word'' back\\\\slash éé', '(,5]', '[2026-01-01 00:00:00+00,infinity)', E'{\n  "text": "line1\\nline2\\ttab \\"q\\" \\\\ \\u00e9 😀",\n  "n": [1e100, -0, 0.1]\r\n}', E'{"s": "line1\\nline2", "e": "😀", "empty": "", "nested": {"a": [[], {}, null, true, false]}, "big": 12345678901234567890.5}', '{NULL,-1,2147483647}', ARRAY[NULL, '', 'NULL', 'null', 'a,b', '{braces}', 'quote"d', 'back\slash', ' spaced ', 'é😀', E'new\nline'], '{{1,NULL},{NULL,4}}', '[5:6][1:2]={{1,2},{3,4}}', ARRAY['"str"'::jsonb, '[1,{"a":"b"}]', NULL], '{Infinity,-Infinity,123456789012345678901234567890.123456789}', '{NULL}', '{"2026-06-30 23:59:59.999999+00",NULL,-infinity}', '{(3,3),(1,1)}', '{1e308,5e-324,-1.5}', 'with "quote"', 2147483647, ROW(-1, E'multi\nline'), ROW(3, '"'), ARRAY['with "quote"', 'it''s', 'so-so']::mood[], 'blue');
-- [main]
INSERT INTO all_types (id, c_numeric, c_numeric_p, c_float4, c_float8, c_text, c_date, c_ts, c_tstz, c_interval, c_time, c_int_arr, c_numeric_arr) VALUES (5, '-Infinity', 0.0000000001, '3.4028235e+38', '1.7976931348623157e308', repeat('x', 300), '0044-03-15 BC', '0001-01-01 00:00:00 BC', '1999-12-31 23:59:59.999999+00', '-178000000 years', '23:59:59.999999', '{{{1},{2}},{{3},{4}}}', '{12345678901234567890.123456789012345678901234567890,0.000}');
-- [main]
UPDATE all_types SET c_text = E'updated\ttext', c_int_arr = '{9}' WHERE id = 1;
-- [main]
UPDATE all_types SET id = 40, c_int4 = 0 WHERE id = 4;
-- [main]
DELETE FROM all_types WHERE id = 5;
-- [main]
INSERT INTO "My Schema"."odd.table" VALUES (1, 'x"y''z', 1.50), (2, NULL, -0.0);
-- [main]
UPDATE "My Schema"."odd.table" SET "x""y" = 'changed' WHERE "a b" = 1;
-- [main]
DELETE FROM "My Schema"."odd.table" WHERE "a b" = 2;

-- ===== case: replica_identity =====
-- [setup]
CREATE TABLE ri_default (id int PRIMARY KEY, v text);
-- [setup]
CREATE TABLE ri_full (id int, v text, n numeric);
-- [setup]
ALTER TABLE ri_full REPLICA IDENTITY FULL;
-- [setup]
CREATE TABLE ri_index (a int NOT NULL, b text NOT NULL, v text);
-- [setup]
CREATE UNIQUE INDEX ri_index_ab ON ri_index (a, b);
-- [setup]
ALTER TABLE ri_index REPLICA IDENTITY USING INDEX ri_index_ab;
-- [setup]
CREATE TABLE ri_nothing (id int, v text);
-- [setup]
ALTER TABLE ri_nothing REPLICA IDENTITY NOTHING;
-- [setup]
CREATE PUBLICATION pub FOR TABLE ri_default, ri_full, ri_index;
-- [setup]
CREATE PUBLICATION pub_ins FOR TABLE ri_nothing WITH (publish = 'insert');
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO ri_default VALUES (1, 'a'), (2, 'b'), (3, 'c');
-- [main]
UPDATE ri_default SET v = 'a2' WHERE id = 1;
-- [main]
UPDATE ri_default SET id = 10 WHERE id = 2;
-- [main]
UPDATE ri_default SET id = id + 100, v = 'both' WHERE id = 3;
-- [main]
DELETE FROM ri_default WHERE id = 10;
-- [main]
INSERT INTO ri_full VALUES (1, 'a', 1.5), (2, NULL, NULL), (3, 'dup', 0), (3, 'dup', 0);
-- [main]
UPDATE ri_full SET v = 'a2' WHERE id = 1;
-- [main]
UPDATE ri_full SET id = 20, n = -1 WHERE id = 2;
-- [main]
DELETE FROM ri_full WHERE id = 1;
-- [main]
DELETE FROM ri_full WHERE id = 3;
-- [main]
INSERT INTO ri_index VALUES (1, 'x', 'v1'), (2, 'y', NULL);
-- [main]
UPDATE ri_index SET v = 'v2' WHERE a = 1;
-- [main]
UPDATE ri_index SET b = 'x2' WHERE a = 1;
-- [main]
DELETE FROM ri_index WHERE a = 2;
-- [main]
INSERT INTO ri_nothing VALUES (1, 'n1'), (2, 'n2');
-- [main]
UPDATE ri_nothing SET v = 'n1b' WHERE id = 1;
-- [main]
DELETE FROM ri_nothing WHERE id = 2;
-- [main]
BEGIN;
-- [main]
INSERT INTO ri_default VALUES (50, 'several in one');
-- [main]
UPDATE ri_full SET n = n + 1;
-- [main]
DELETE FROM ri_index;
-- [main]
COMMIT;

-- ===== case: toast =====
-- [setup]
CREATE TABLE toast_d (id int PRIMARY KEY, n int, big text, small text);
-- [setup]
CREATE TABLE toast_f (id int, n int, big text, small text);
-- [setup]
ALTER TABLE toast_f REPLICA IDENTITY FULL;
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO toast_d VALUES (1, 0, (SELECT string_agg(md5(g::text || 'a'), '') FROM generate_series(1, 100) g), 's1'), (2, 0, 'short', 's2');
-- [main]
UPDATE toast_d SET n = 1 WHERE id = 1;
-- [main]
UPDATE toast_d SET n = 2, small = NULL WHERE id = 1;
-- [main]
UPDATE toast_d SET big = (SELECT string_agg(md5(g::text || 'b'), '') FROM generate_series(1, 100) g) WHERE id = 1;
-- [main]
UPDATE toast_d SET n = 3 WHERE id = 2;
-- [main]
UPDATE toast_d SET big = NULL, n = 4 WHERE id = 1;
-- [main]
UPDATE toast_d SET big = (SELECT string_agg(md5(g::text || 'c'), '') FROM generate_series(1, 100) g) WHERE id = 2;
-- [main]
UPDATE toast_d SET n = 5 WHERE id = 2;
-- [main]
DELETE FROM toast_d WHERE id = 2;
-- [main]
INSERT INTO toast_f VALUES (1, 0, (SELECT string_agg(md5(g::text || 'a'), '') FROM generate_series(1, 100) g), 's1'), (2, 0, 'short', 's2');
-- [main]
UPDATE toast_f SET n = 1 WHERE id = 1;
-- [main]
UPDATE toast_f SET n = 2, small = NULL WHERE id = 1;
-- [main]
UPDATE toast_f SET big = (SELECT string_agg(md5(g::text || 'b'), '') FROM generate_series(1, 100) g) WHERE id = 1;
-- [main]
UPDATE toast_f SET n = 3 WHERE id = 2;
-- [main]
UPDATE toast_f SET big = NULL, n = 4 WHERE id = 1;
-- [main]
UPDATE toast_f SET big = (SELECT string_agg(md5(g::text || 'c'), '') FROM generate_series(1, 100) g) WHERE id = 2;
-- [main]
UPDATE toast_f SET n = 5 WHERE id = 2;
-- [main]
DELETE FROM toast_f WHERE id = 2;

-- ===== case: truncate =====
-- [setup]
CREATE TABLE parent (id int PRIMARY KEY);
-- [setup]
CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent);
-- [setup]
CREATE TABLE seq_t (id int GENERATED ALWAYS AS IDENTITY PRIMARY KEY, v text);
-- [setup]
CREATE TABLE plain_a (id int PRIMARY KEY);
-- [setup]
CREATE TABLE plain_b (id int PRIMARY KEY);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO parent VALUES (1), (2);
-- [main]
INSERT INTO child VALUES (1, 1), (2, 2);
-- [main]
INSERT INTO seq_t (v) VALUES ('a'), ('b');
-- [main]
INSERT INTO plain_a VALUES (1);
-- [main]
INSERT INTO plain_b VALUES (1);
-- [main]
TRUNCATE parent CASCADE;
-- [main]
TRUNCATE seq_t RESTART IDENTITY;
-- [main]
INSERT INTO seq_t (v) VALUES ('c');
-- [main]
TRUNCATE plain_a, plain_b;
-- [main]
BEGIN;
-- [main]
INSERT INTO plain_a VALUES (2);
-- [main]
TRUNCATE plain_a;
-- [main]
INSERT INTO plain_a VALUES (3);
-- [main]
COMMIT;
-- [main]
TRUNCATE ONLY plain_b RESTART IDENTITY CASCADE;

-- ===== case: messages =====
-- [setup]
CREATE TABLE m_t (id int PRIMARY KEY);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
SELECT pg_logical_emit_message(true, 'txn', 'transactional text');
-- [main]
SELECT pg_logical_emit_message(false, 'nontxn', 'non-transactional text');
-- [main]
SELECT pg_logical_emit_message(true, 'bin', '\x00c3a9017f'::bytea);
-- [main]
SELECT pg_logical_emit_message(true, 'nonutf8', '\xfffe00'::bytea);
-- [main]
SELECT pg_logical_emit_message(true, '', 'empty prefix');
-- [main]
SELECT pg_logical_emit_message(false, 'empty', '');
-- [main]
BEGIN;
-- [main]
INSERT INTO m_t VALUES (1);
-- [main]
SELECT pg_logical_emit_message(true, 'in-txn', 'with a row');
-- [main]
SELECT pg_logical_emit_message(false, 'nt-in-txn', 'sent at once');
-- [main]
COMMIT;
-- [main]
BEGIN;
-- [main]
SELECT pg_logical_emit_message(true, 'rolled-back', 'never decoded');
-- [main]
SELECT pg_logical_emit_message(false, 'nt-rolled-back', 'decoded anyway');
-- [main]
ROLLBACK;
-- [main]
SELECT pg_logical_emit_message(true, 'unicode é😀', E'multi\nline é😀 "quoted" \\ back');

-- ===== case: streaming =====
-- [setup]
CREATE TABLE big (id int PRIMARY KEY, v text);
-- [setup]
CREATE TABLE small (id int PRIMARY KEY, v text);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [A]
BEGIN;
-- [A]
INSERT INTO big SELECT g, 'v' || g FROM generate_series(1, 1000) g;
-- [A]
SAVEPOINT s1;
-- [A]
INSERT INTO big SELECT g, 'rolled back' FROM generate_series(1001, 1500) g;
-- [A]
ROLLBACK TO SAVEPOINT s1;
-- [B]
INSERT INTO small VALUES (1, 'committed while A is open');
-- [A]
SAVEPOINT s2;
-- [A]
INSERT INTO big SELECT g, 'kept subxact' FROM generate_series(1501, 1700) g;
-- [A]
RELEASE SAVEPOINT s2;
-- [A]
INSERT INTO big SELECT g, 'v' || g FROM generate_series(1701, 2000) g;
-- [A]
UPDATE big SET v = 'updated' WHERE id <= 5;
-- [B]
INSERT INTO small VALUES (2, 'second small');
-- [A]
COMMIT;
-- [A]
BEGIN;
-- [A]
INSERT INTO big SELECT g, 'aborted' FROM generate_series(3001, 3800) g;
-- [A]
ROLLBACK;
-- [B]
INSERT INTO small VALUES (3, 'after');

-- ===== case: twophase =====
-- [setup]
CREATE TABLE tp (id int PRIMARY KEY, v text);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, true);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, true);
-- [main]
BEGIN;
-- [main]
INSERT INTO tp VALUES (1, 'committed'), (2, 'c2');
-- [main]
PREPARE TRANSACTION 'gx_commit';
-- [main]
COMMIT PREPARED 'gx_commit';
-- [main]
BEGIN;
-- [main]
INSERT INTO tp VALUES (3, 'rolled back');
-- [main]
UPDATE tp SET v = 'rb' WHERE id = 1;
-- [main]
PREPARE TRANSACTION 'gx ''quoted'' rollback';
-- [main]
ROLLBACK PREPARED 'gx ''quoted'' rollback';
-- [main]
BEGIN;
-- [main]
INSERT INTO tp SELECT g, 'big' FROM generate_series(100, 899) g;
-- [main]
PREPARE TRANSACTION 'gx_big';
-- [main]
COMMIT PREPARED 'gx_big';
-- [main]
BEGIN;
-- [main]
INSERT INTO tp SELECT g, 'big rolled back' FROM generate_series(2000, 2599) g;
-- [main]
PREPARE TRANSACTION 'gx_big_rb';
-- [main]
ROLLBACK PREPARED 'gx_big_rb';
-- [main]
INSERT INTO tp VALUES (5, 'plain commit');
-- [main]
BEGIN;
-- [main]
INSERT INTO tp VALUES (4, 'still prepared');
-- [main]
PREPARE TRANSACTION 'gx_pending';
-- [teardown]
ROLLBACK PREPARED 'gx_pending';

-- ===== case: origin =====
-- [setup]
CREATE TABLE o_t (id int PRIMARY KEY, v text);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_replication_origin_create('myorigin');
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO o_t VALUES (1, 'local');
-- [with origin]
SELECT pg_replication_origin_session_setup('myorigin');
-- [with origin]
BEGIN;
-- [with origin]
SELECT pg_replication_origin_xact_setup('0/ABCDEF0', '2026-01-02 03:04:05.678+00');
-- [with origin]
INSERT INTO o_t VALUES (2, 'from origin');
-- [with origin]
UPDATE o_t SET v = 'changed by origin' WHERE id = 1;
-- [with origin]
COMMIT;
-- [with origin]
INSERT INTO o_t VALUES (3, 'origin, no xact setup');
-- [with origin]
SELECT pg_replication_origin_session_reset();
-- [main]
INSERT INTO o_t VALUES (4, 'local again');

-- ===== case: binary =====
-- [setup]
CREATE TYPE mood AS ENUM ('sad', 'happy');
-- [setup]
CREATE TABLE bin_types (
            id int PRIMARY KEY, b bool, i2 int2, i4 int4, i8 int8, o oid, f4 float4, f8 float8, n numeric,
            t text, vc varchar(10), bc char(4), nm name, by bytea, u uuid, d date, tm time, ts timestamp,
            tstz timestamptz, iv interval, j json, jb jsonb,
            a_int int[], a_text text[], a_2d int[], a_lb int[], a_num numeric[], a_jsonb jsonb[], a_bool bool[],
            a_tstz timestamptz[], a_f8 float8[], a_uuid uuid[], a_date date[], a_bytea bytea[], a_i8 int8[],
            tz timetz, ip inet, e mood, r int4range);
-- [setup]
CREATE TABLE bin_numeric (id int PRIMARY KEY, n numeric, n2 numeric(10,4));
-- [setup]
CREATE TABLE bin_time (id int PRIMARY KEY, d date, tm time, ts timestamp, tstz timestamptz, iv interval);
-- [setup]
CREATE PUBLICATION pub FOR ALL TABLES;
-- [setup]
SELECT pg_create_logical_replication_slot('p', 'pgoutput', false, false);
-- [setup]
SELECT pg_create_logical_replication_slot('t', 'test_decoding', false, false);
-- [main]
INSERT INTO bin_types VALUES (1, true, 1, 2, 3, 4, 1.5, -2.25, 3.14159, 'text', 'vc', 'bc', 'nm',
            '\xdeadbeef', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '2026-01-02', '03:04:05.123456',
            '2026-01-02 03:04:05.123', '2026-01-02 03:04:05.123+05:30', '1 year 2 mons 3 days 04:05:06.789',
            '{"a": [1, 2.5, "x"], "b": {"c": null}}', '{"a": [1, 2.5, "x"], "b": {"c": null}}',
            '{1,2,3}', '{a,b}', '{{1,2},{3,4}}', '[0:1]={1,2}', '{1.5,NaN,-0.001}', ARRAY['{"k": 1}'::jsonb, 'null'],
            '{t,f,NULL}', '{"2026-01-02 03:04:05+00",infinity}', '{1.5,NaN,Infinity,-Infinity,-0}',
            '{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11,NULL}', '{2026-01-02,-infinity}', '{"\\x00ff",NULL,"\\x"}',
            '{-9223372036854775808,9223372036854775807}', '03:04:05+02', '192.168.1.5/24', 'happy', '[1,10)');
-- [main]
INSERT INTO bin_types (id) VALUES (2);
-- [main]
INSERT INTO bin_types VALUES (3, false, -32768, -2147483648, -9223372036854775808, 4294967295,
            '-Infinity', '-0', 'NaN', '', '', '', '', '\x', '00000000-0000-0000-0000-000000000000', '-infinity',
            '00:00:00', '-infinity', '-infinity', '-1 day -1 second', 'null', 'null',
            '{}', '{}', '{}', '[-2:-1]={-1,-2}', '{}', '{}', '{}', '{-infinity}', '{}', '{}', '{}', '{}', '{}',
            '23:59:59.999999-12', '::1', 'sad', 'empty');
-- [main]
INSERT INTO bin_types VALUES (4, true, 32767, 2147483647, 9223372036854775807, 0, 'Infinity', 'NaN',
            'Infinity', E'unicode \u00e9 \U0001F600 quotes '' " \\ new\nline\ttab', 'ünïcödé', 'ñ😀', 'Ωmega',
            '\x00ff00', 'ffffffff-ffff-ffff-ffff-ffffffffffff', 'infinity', '24:00:00', 'infinity', 'infinity',
            '178000000 years', E'{\n  "s": "line1\\nline2 \\u00e9 😀",\n  "n": [1e100, -0, 0.1]\r\n}',
            '{"s": "line1\\nline2", "e": "😀", "nested": {"a": [[], {}, null, true, false]}, "big": 1.5e300}',
            '{NULL,-1,2147483647}', ARRAY[NULL, '', 'NULL', 'a,b', '{braces}', 'quote"d', 'back\slash', 'é😀'],
            '{{1,NULL},{NULL,4}}', '[5:6][1:2]={{1,2},{3,4}}',
            '{Infinity,-Infinity,123456789012345678901234567890.1}',
            ARRAY['"str"'::jsonb, '[1,{"a":"b"}]', NULL], '{NULL}', '{"2026-06-30 23:59:59.999999+00",NULL}',
            '{1e308,5e-324,-1.5}', '{}', '{0044-03-15 BC,infinity}', '{}', '{0,NULL}', '24:00:00+15:59',
            '::ffff:1.2.3.4', 'sad', '(,5]');
-- [main]
UPDATE bin_types SET t = 'updated', a_int = '{9}' WHERE id = 1;
-- [main]
DELETE FROM bin_types WHERE id = 3;
-- [main]
INSERT INTO bin_numeric VALUES (1, 0, 0);
-- [main]
INSERT INTO bin_numeric VALUES (2, -0.0, -0.0);
-- [main]
INSERT INTO bin_numeric VALUES (3, 1, 1);
-- [main]
INSERT INTO bin_numeric VALUES (4, -1, -1);
-- [main]
INSERT INTO bin_numeric VALUES (5, 0.0001, 0.0001);
-- [main]
INSERT INTO bin_numeric VALUES (6, 0.00000000000000000001, 0.00000000000000000001);
-- [main]
INSERT INTO bin_numeric VALUES (7, 100000000000000000000, NULL);
-- [main]
INSERT INTO bin_numeric VALUES (8, 123.4500, 123.4500);
-- [main]
INSERT INTO bin_numeric VALUES (9, -987654321.123456789, NULL);
-- [main]
INSERT INTO bin_numeric VALUES (10, 12345678901234567890.123456789012345678901234567890, NULL);
-- [main]
INSERT INTO bin_numeric VALUES (11, 9999, 9999);
-- [main]
INSERT INTO bin_numeric VALUES (12, 10000, 10000);
-- [main]
INSERT INTO bin_numeric VALUES (13, 0.5, 0.5);
-- [main]
INSERT INTO bin_numeric VALUES (14, 1e-130, 1e-130);
-- [main]
INSERT INTO bin_numeric VALUES (15, -1.5e300, NULL);
-- [main]
INSERT INTO bin_numeric VALUES (16, 'NaN', 'NaN');
-- [main]
INSERT INTO bin_numeric VALUES (17, 'Infinity', NULL);
-- [main]
INSERT INTO bin_numeric VALUES (18, '-Infinity', NULL);
-- [main]
INSERT INTO bin_numeric VALUES (19, NULL, NULL);
-- [main]
INSERT INTO bin_time VALUES (1, '2026-01-02', '03:04:05.123456', '2026-01-02 03:04:05.123456', '2026-01-02 03:04:05.5+05:30', '1 year 2 mons 3 days 04:05:06.789');
-- [main]
INSERT INTO bin_time VALUES (2, '2000-01-01', '00:00:00', '2000-01-01 00:00:00', '2000-01-01 00:00:00+00', '0');
-- [main]
INSERT INTO bin_time VALUES (3, '1999-12-31', '23:59:59.999999', '1999-12-31 23:59:59.999999', '1999-12-31 23:59:59.000001+00', '-1 days +02:03:04');
-- [main]
INSERT INTO bin_time VALUES (4, '0044-03-15 BC', '12:00:00', '0001-01-01 00:00:00 BC', '1900-06-15 12:34:56+00', '00:00:00.000001');
-- [main]
INSERT INTO bin_time VALUES (5, '5874897-12-31', '24:00:00', '294276-12-31 23:59:59.999999', '1970-01-01 00:00:00+00', '1 mon -1 days');
-- [main]
INSERT INTO bin_time VALUES (6, '-infinity', NULL, '-infinity', '-infinity', '-178000000 years');
-- [main]
INSERT INTO bin_time VALUES (7, 'infinity', NULL, 'infinity', 'infinity', '178000000 years 11 mons 30 days 23:59:59.999999');
