// pgmq's JavaScript client (pgmq-js from npm), unchanged, against LonnyMQ's pgmq facade: the
// calls a pgmq user's code makes, in order, each result printed as one JSON line
// {"step": ..., "result": ...} for tests/pgmq/test_js_client.py to check against the database.
// Connection: PGHOST, PGPORT, PGDATABASE, PGUSER, PGPASSWORD. Queue: argv[2].
"use strict";
const { Pgmq } = require("pgmq-js");

async function main() {
  const q = process.argv[2];
  const pgmq = await Pgmq.new(
    {
      host: process.env.PGHOST,
      port: Number(process.env.PGPORT),
      database: process.env.PGDATABASE,
      user: process.env.PGUSER,
      password: process.env.PGPASSWORD || "",
      ssl: false,
    },
    { skipExtensionCreation: true }, // the facade is installed by lonnymq migrate --pgmq
  );
  const out = (step, result) => console.log(JSON.stringify({ step, result }));
  try {
    await pgmq.queue.create(q);
    out("list", (await pgmq.queue.list()).map((x) => x.name));
    const one = await pgmq.msg.send(q, { n: 1 });
    const batch = await pgmq.msg.sendBatch(q, [{ n: 2 }, { n: 3 }, { n: 4 }, { n: 5 }]);
    out("sent", [one, ...batch]);
    const read = await pgmq.msg.read(q, 30);
    out("read", { msgId: read.msgId, readCount: read.readCount, message: read.message });
    out("delete", await pgmq.msg.delete(q, read.msgId));
    out("delete again", await pgmq.msg.delete(q, read.msgId));
    const two = await pgmq.msg.readBatch(q, 30, 2);
    out("read batch", two.map((m) => m.msgId));
    out("archive", await pgmq.msg.archive(q, two[0].msgId));
    out("delete batch", await pgmq.msg.deleteBatch(q, [two[1].msgId, 999999]));
    const popped = await pgmq.msg.pop(q);
    out("pop", popped === undefined ? null : { msgId: popped.msgId, message: popped.message });
    out("read rest", (await pgmq.msg.readBatch(q, 30, 10)).map((m) => m.msgId));
    const m = await pgmq.queue.getMetrics(q);
    out("metrics", { queueName: m.queueName, queueLength: m.queueLength, totalMessages: m.totalMessages });
    out("metrics all", (await pgmq.queue.getAllMetrics()).map((x) => x.queueName));
    const late = await pgmq.msg.send(q, { n: 6 }, 3600);
    out("archive batch", await pgmq.msg.archiveBatch(q, [late]));
    await pgmq.queue.purge(q);
    out("after purge", (await pgmq.queue.getMetrics(q)).queueLength);
  } finally {
    await pgmq.close();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
