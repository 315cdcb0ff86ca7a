// Which Query texts Kiln answers itself as CREATE DATABASE / DROP DATABASE (database-statements.ts):
// exactly one such statement, as Prisma, createdb, dropdb and psql send it; anything else is the engine's.
import { describe, expect, test } from "vitest";
import { databaseStatementOf, parseDatabaseStatement } from "../../server/backends/databases/wire/database-statements";
import { simpleQuery, MessageBuilder } from "../../server/backends/databases/wire/protocol";

describe("parseDatabaseStatement", () => {
  test("what clients send", () => {
    expect(parseDatabaseStatement(`CREATE DATABASE "prisma_migrate_shadow_db_1b4e28ba-2fa1-11d2-883f-0016d3cca427"`)).toEqual({
      kind: "create",
      name: "prisma_migrate_shadow_db_1b4e28ba-2fa1-11d2-883f-0016d3cca427",
      template: null,
      options: [],
    });
    expect(parseDatabaseStatement(`CREATE DATABASE worker_1;`)).toMatchObject({ kind: "create", name: "worker_1" });
    expect(parseDatabaseStatement(`-- a comment\ncreate database "My""Db" /* c */ with template = app encoding 'UTF8' connection limit -1 ;`)).toEqual({
      kind: "create",
      name: 'My"Db',
      template: "app",
      options: [
        { name: "encoding", value: "UTF8" },
        { name: "connection limit", value: "-1" },
      ],
    });
    expect(parseDatabaseStatement(`DROP DATABASE IF EXISTS "x" WITH (FORCE)`)).toEqual({ kind: "drop", name: "x", ifExists: true, force: true });
    expect(parseDatabaseStatement(`DROP DATABASE x (force);`)).toEqual({ kind: "drop", name: "x", ifExists: false, force: true });
    expect(parseDatabaseStatement(`drop database Worker_1`)).toEqual({ kind: "drop", name: "worker_1", ifExists: false, force: false });
  });

  test("anything else is left to the engine", () => {
    for (const sql of [
      `select 1`,
      `create database a; create database b`,
      `select 1; drop database a`,
      `create database`,
      `create database a with frobnicate 1`,
      `drop database a cascade`,
      `drop database a with (force`,
      `create database a template $$x$$`,
      `create table database (x int)`,
      `create database ""`,
    ])
      expect(parseDatabaseStatement(sql), sql).toBeNull();
  });

  test("databaseStatementOf looks only at Query messages, cheaply", () => {
    expect(databaseStatementOf(simpleQuery(`  CREATE DATABASE a`))).toMatchObject({ kind: "create", name: "a" });
    expect(databaseStatementOf(simpleQuery(`/* x */ drop database a`))).toMatchObject({ kind: "drop", name: "a" });
    expect(databaseStatementOf(simpleQuery(`select 'create database a'`))).toBeNull();
    // A Parse of the same text is not taken (the extended protocol goes to the engine).
    expect(databaseStatementOf(new MessageBuilder().cstring("").cstring("create database a").int16(0).build(0x50))).toBeNull();
  });
});
