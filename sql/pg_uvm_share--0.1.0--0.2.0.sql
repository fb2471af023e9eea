-- pg_uvm_share 0.1.0 -> 0.2.0, run by ALTER EXTENSION pg_uvm_share UPDATE.
--
-- Every change to an SQL object between the two versions goes here, so that an updated
-- installation has exactly the catalog of a fresh 0.2.0 install (tests/regress/sql/
-- uvm_upgrade.sql compares the two). The objects live in schema @extschema@ (uvm).
\echo Use "ALTER EXTENSION pg_uvm_share UPDATE TO '0.2.0'" to load this file. \quit

-- PostgreSQL requires the serialization and deserialization functions of an aggregate to be
-- STRICT (its opr_sanity checks); gpujoin_probe and gpujoin_materialize share these two.
ALTER FUNCTION @extschema@.gpujoin_probe_serial(internal) STRICT;
ALTER FUNCTION @extschema@.gpujoin_probe_deserial(bytea, internal) STRICT;
