// kafkajs for shmlog's tests, driven by tests/kafka_clients/kafkajs.py: one request
// as JSON on stdin ({action: "produce" | "consume" | "metadata", ...}), one answer as
// JSON on stdout. Keys, values and header values travel as base64 (null stays null).
// kafkajs logs to stderr only, so stdout holds the answer alone. The caller bounds
// the whole process; the script also stops itself at the request's timeout_ms.
// A group member (`node kafkajs_client.js member '<request as JSON>'`) instead runs
// until its stdin ends (or its timeout_ms), printing each record it reads as a line
// of JSON as it reads it, and committing each record read (autoCommitThreshold 1).
'use strict';
const { Kafka, logLevel } = require('kafkajs');

const bytes = (text) => (text === null ? null : Buffer.from(text, 'base64'));
const text = (buffer) => (buffer === null || buffer === undefined ? null : buffer.toString('base64'));

function client(request) {
  return new Kafka({
    clientId: request.client_id || 'shmlog-tests',
    brokers: request.bootstrap.split(','),
    connectionTimeout: request.timeout_ms,
    requestTimeout: request.timeout_ms,
    retry: { retries: 3, maxRetryTime: request.timeout_ms },
    logLevel: logLevel.ERROR,
    logCreator: () => ({ namespace, log }) => process.stderr.write(`${namespace}: ${JSON.stringify(log)}\n`),
  });
}

function headersOf(pairs) {
  // kafkajs takes headers as an object; a name given twice becomes an array.
  const headers = {};
  for (const [name, value] of pairs) {
    const buffer = bytes(value);
    if (name in headers) headers[name] = [].concat(headers[name], buffer);
    else headers[name] = buffer;
  }
  return headers;
}

function message(record) {
  const sent = { key: bytes(record.key), value: bytes(record.value), headers: headersOf(record.headers) };
  if (record.partition !== null) sent.partition = record.partition;
  if (record.timestamp_ms !== null) sent.timestamp = String(record.timestamp_ms);
  return sent;
}

async function produce(request) {
  const producer = client(request).producer({
    idempotent: request.idempotence,
    maxInFlightRequests: request.idempotence ? 1 : undefined,
    allowAutoTopicCreation: true,
  });
  await producer.connect();
  const acks = { 0: 0, 1: 1, all: -1 }[request.acks];
  const deliveries = [];
  try {
    // One send per record: kafkajs reports a base offset per partition, not per
    // message, and does not say where its partitioner put a record.
    for (const record of request.records) {
      try {
        const answer = await producer.send({ topic: request.topic, acks, messages: [message(record)] });
        const [meta] = answer;
        deliveries.push(meta === undefined
          ? { partition: record.partition, offset: null, error: null }
          : { partition: meta.partition, offset: Number(meta.baseOffset), error: meta.errorCode ? `error code ${meta.errorCode}` : null });
      } catch (error) {
        deliveries.push({ partition: record.partition, offset: null, error: String(error) });
      }
    }
  } finally {
    await producer.disconnect();
  }
  return deliveries;
}

function flatHeaders(headers) {
  const pairs = [];
  for (const [name, value] of Object.entries(headers || {})) {
    for (const one of [].concat(value)) pairs.push([name, text(one)]);
  }
  return pairs;
}

async function consume(request) {
  const groupId = request.group_id || `kafka-clients-${process.pid}-${Date.now()}`;
  const consumer = client(request).consumer({ groupId, allowAutoTopicCreation: false });
  const starts = request.offsets;   // {partition: offset} or null (the group's positions)
  const found = [];
  const seen = new Set();
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [request.topic], fromBeginning: true });
    let finish;
    let fail;
    const finished = new Promise((resolve, reject) => { finish = resolve; fail = reject; });
    const timer = setTimeout(finish, request.timeout_ms);
    // A consumer that crashes (kafkajs retries, then gives up) fails the request.
    consumer.on(consumer.events.CRASH, ({ payload }) => fail(payload.error));
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message: m }) => {
        const offset = Number(m.offset);
        // Assigned reading: only the partitions asked for, from their offsets
        // (a fetch made before the seeks took effect can hand earlier records).
        if (starts !== null && (!(partition in starts) || offset < starts[partition])) return;
        if (seen.has(`${partition}:${offset}`) || found.length >= request.count) return;
        seen.add(`${partition}:${offset}`);
        found.push({ partition, offset, key: text(m.key), value: text(m.value),
                     headers: flatHeaders(m.headers), timestamp_ms: Number(m.timestamp) });
        if (found.length >= request.count) finish();
      },
    });
    // kafkajs seeks only once run() has joined the group.
    try {
      for (const [partition, offset] of Object.entries(starts || {})) {
        consumer.seek({ topic: request.topic, partition: Number(partition), offset: String(offset) });
      }
      await finished;
    } finally {
      clearTimeout(timer);
    }
  } finally {
    await consumer.disconnect();
  }
  return found;
}

async function member(request) {
  const consumer = client(request).consumer({ groupId: request.group_id, allowAutoTopicCreation: false });
  const stopped = new Promise((resolve) => {
    process.stdin.on('end', resolve);
    process.stdin.on('error', resolve);
    setTimeout(resolve, request.timeout_ms);
    process.stdin.resume();
  });
  await consumer.connect();
  try {
    await consumer.subscribe({ topics: [request.topic], fromBeginning: true });
    await consumer.run({
      autoCommit: true,
      autoCommitThreshold: 1,
      eachMessage: async ({ partition, message: m }) => {
        process.stdout.write(`${JSON.stringify({
          partition, offset: Number(m.offset), key: text(m.key), value: text(m.value),
          headers: flatHeaders(m.headers), timestamp_ms: Number(m.timestamp) })}\n`);
      },
    });
    await stopped;
  } finally {
    await consumer.disconnect();
  }
}

async function metadata(request) {
  const admin = client(request).admin();
  await admin.connect();
  try {
    const cluster = await admin.describeCluster();
    const listed = await admin.fetchTopicMetadata();
    return {
      brokers: cluster.brokers.map((b) => [b.nodeId, `${b.host}:${b.port}`]),
      topics: listed.topics.map((t) => [t.name, t.partitions.map((p) => [p.partitionId, p.leader])]),
    };
  } finally {
    await admin.disconnect();
  }
}

async function main() {
  if (process.argv[2] === 'member') {
    await member(JSON.parse(process.argv[3]));
    return;
  }
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  const request = JSON.parse(Buffer.concat(chunks).toString());
  const answer = await { produce, consume, metadata }[request.action](request);
  process.stdout.write(JSON.stringify(answer));
}

main().then(() => process.exit(0), (error) => {
  process.stderr.write(`kafkajs: ${error && error.stack ? error.stack : error}\n`);
  process.exit(1);
});
