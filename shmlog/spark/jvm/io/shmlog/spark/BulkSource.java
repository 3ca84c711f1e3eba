package io.shmlog.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.RandomAccessFile;
import java.io.UncheckedIOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Map;
import java.util.HexFormat;
import java.util.List;
import java.util.Set;
import java.util.TreeMap;
import java.util.zip.CRC32C;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;

import com.github.luben.zstd.Zstd;

import org.apache.spark.SparkEnv;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/**
 * The host-pinned bulk reader behind shmlog.spark.bulk_read: a Spark DataSource V2
 * that reads shmlog segment files straight into columnar batches in the executor's
 * JVM, only the columns a query needs. Python plans the offset ranges (below the
 * high watermarks, so every byte read is published) and hands them over as the
 * "plan" option (shmlog/spark/bulk.py's bulk_plan). Outside a cluster each range
 * names the host its partition lives on, which Spark prefers, and a task on another
 * host fails instead of reading anything else. In a cluster each range names the
 * hosts of its in-sync replicas (the preferred locations) and a task reads the copy
 * of its own host's broker (SHMLOG_SPARK_BOOTSTRAP, else the plan's bootstrap: every
 * broker hosts every partition) below that copy's high watermark, which it reads
 * from the broker's state table in /dev/shm (state_layout.py) and waits for, bounded.
 * The read is local when the executor's host is among the range's hosts, remote
 * otherwise; with includeReadLocality every row says which (column readLocality).
 *
 * The segment format is shmlog/record/batch_layout.py's: 64-byte batch headers, CRC32C
 * over everything after the CRC field, zstd-compressed records regions, records
 * with a 28-byte header. Every batch read is checked against its CRC.
 *
 * In read_committed (a range's readCommitted) the plan ends at the last stable offsets, and the
 * reader leaves out every transactional batch of an aborted transaction: one whose producer id
 * and base offset fall in an entry of the partition's .txnindex files (transaction_index_layout.py:
 * 34-byte big-endian entries: version i16, producer id, first offset, last offset, last stable
 * offset, i64 each). In a cluster it waits for its copy's last stable offset (the row's word at
 * byte 64) instead of the high watermark. Markers (control batches) are never rows.
 */
public final class BulkSource implements TableProvider {
    static final StructType SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("key", DataTypes.BinaryType, true),
        DataTypes.createStructField("value", DataTypes.BinaryType, true),
        DataTypes.createStructField("topic", DataTypes.StringType, true),
        DataTypes.createStructField("partition", DataTypes.IntegerType, true),
        DataTypes.createStructField("offset", DataTypes.LongType, true),
        DataTypes.createStructField("timestamp", DataTypes.TimestampType, true),
        DataTypes.createStructField("timestampType", DataTypes.IntegerType, true)});

    static final StructType SCHEMA_WITH_READ_LOCALITY =
        SCHEMA.add(DataTypes.createStructField("readLocality", DataTypes.StringType, true));

    @Override public StructType inferSchema(CaseInsensitiveStringMap options) {
        return options.getBoolean("includeReadLocality", false) ? SCHEMA_WITH_READ_LOCALITY : SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new BulkTable(properties.get("plan"), schema);
    }

    static final class BulkTable implements SupportsRead {
        private final String plan;
        private final StructType schema;
        BulkTable(String plan, StructType schema) { this.plan = plan; this.schema = schema; }
        @Override public String name() { return "shmlog-bulk"; }
        @Override public StructType schema() { return schema; }
        @Override public Set<TableCapability> capabilities() { return Set.of(TableCapability.BATCH_READ); }
        @Override public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return new BulkScan(plan == null ? options.get("plan") : plan, schema);
        }
    }

    /** The scan: its builder (column pruning), itself, and its batch. */
    static final class BulkScan implements ScanBuilder, SupportsPushDownRequiredColumns, Scan, Batch {
        private final String plan;
        private StructType required;

        BulkScan(String plan, StructType schema) {
            if (plan == null) throw new IllegalArgumentException("shmlog-bulk needs the plan option (use shmlog.spark.bulk_read)");
            this.plan = plan;
            this.required = schema;
        }
        @Override public void pruneColumns(StructType requiredSchema) { required = requiredSchema; }
        @Override public Scan build() { return this; }
        @Override public StructType readSchema() { return required; }
        @Override public Batch toBatch() { return this; }

        @Override
        public InputPartition[] planInputPartitions() {
            try {
                ArrayList<Range> ranges = new ArrayList<>();
                for (JsonNode node : new ObjectMapper().readTree(plan)) {
                    ranges.add(Range.of(node));
                }
                return ranges.toArray(new InputPartition[0]);
            } catch (IOException error) {
                throw new UncheckedIOException("shmlog-bulk: the plan is not valid JSON", error);
            }
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            String[] columns = required.fieldNames();
            return new ReaderFactory(columns);
        }
    }

    /**
     * Offsets [start, end) of one log partition. Outside a cluster: stored in directory on host.
     * In a cluster (hosts != null): held by the brokers on hosts in sync, and by every broker at
     * relative under its data directory, whose state-table row has topicKey.
     */
    static final class Range implements InputPartition {
        final String topic, directory, host, bootstrap, relative;
        final String[] hosts;
        final int partition;
        final long start, end, topicKey, waitMs, pollMs;
        final boolean readCommitted;

        private Range(JsonNode node) {
            topic = node.get("topic").asText();
            partition = node.get("partition").asInt();
            directory = node.get("directory").asText();
            start = node.get("start").asLong();
            end = node.get("end").asLong();
            bootstrap = node.path("bootstrap").asText(null);
            host = node.path("host").asText(null);
            JsonNode preferred = node.get("hosts");
            if (preferred == null) {
                hosts = null;
            } else {
                hosts = new String[preferred.size()];
                for (int index = 0; index < hosts.length; index++) hosts[index] = preferred.get(index).asText();
            }
            relative = node.path("relative").asText(null);
            topicKey = node.path("topicKey").asLong(0);
            waitMs = node.path("waitMs").asLong(0);
            pollMs = Math.max(1, node.path("pollMs").asLong(1));
            readCommitted = node.path("readCommitted").asBoolean(false);
        }

        static Range of(JsonNode node) { return new Range(node); }
        boolean clustered() { return hosts != null; }
        @Override public String[] preferredLocations() { return clustered() ? hosts : new String[] {host}; }
    }

    static final class ReaderFactory implements PartitionReaderFactory {
        private final String[] columns;
        ReaderFactory(String[] columns) { this.columns = columns; }
        @Override public boolean supportColumnarReads(InputPartition partition) { return true; }
        @Override public PartitionReader<InternalRow> createReader(InputPartition partition) {
            throw new UnsupportedOperationException("shmlog-bulk reads columnar batches only");
        }
        @Override public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
            return new RangeReader((Range) partition, columns);
        }
    }

    /** Reads one range, batch by batch of the log, into columnar batches of the required columns. */
    static final class RangeReader implements PartitionReader<ColumnarBatch> {
        // segments.py's SWAP_MANIFEST_FILE: present while a compaction swap replaces files.
        static final String SWAP_MANIFEST_FILE = "cleaning-swap.json";
        // How long a listing waits for a swap to end (a swap is renames and unlinks: milliseconds;
        // a minute covers a loaded disk) and how often it looks again meanwhile.
        static final long LISTING_WAIT_NANOS_MAX = 60_000_000_000L;
        static final long LISTING_RETRY_MILLIS = 5;
        // batch header (batch_layout.py)
        static final int BATCH_LENGTH = 0, MAGIC = 4, VERSION = 6, BASE_OFFSET = 8, CRC = 20,
            ATTRIBUTES = 24, RECORD_COUNT = 28, FIRST_TIMESTAMP = 48, MAX_TIMESTAMP = 56, HEADER_LENGTH = 64,
            CRC_COVERED = 24;
        static final int MAGIC_VALUE = 0x4C53, VERSION_VALUE = 1, CODEC_MASK = 0x07, CODEC_ZSTD = 4,
            TIMESTAMP_TYPE_BIT = 0x08, CONTROL_BIT = 0x10, TRANSACTIONAL_BIT = 0x20, PRODUCER_ID = 40;
        // a .txnindex entry (transaction_index_layout.py), big-endian
        static final String TXN_INDEX_SUFFIX = ".txnindex";
        static final int TXN_ENTRY_LENGTH = 34, TXN_VERSION = 0, TXN_PRODUCER_ID = 2, TXN_FIRST_OFFSET = 10,
            TXN_LAST_OFFSET = 18;
        // record header
        static final int RECORD_LENGTH = 0, OFFSET_DELTA = 4, TIMESTAMP_DELTA = 8, KEY_LENGTH = 16,
            VALUE_LENGTH = 20, HEADER_COUNT = 24, RECORD_HEADER_LENGTH = 28, HEADER_ENTRY_LENGTH = 8;
        static final int ROWS_PER_BATCH = 8192;

        static final String[] COLUMNS = {"key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
            "readLocality"};
        static final int KEY = 0, VALUE = 1, TOPIC = 2, PARTITION = 3, OFFSET = 4, TIMESTAMP = 5, TIMESTAMP_TYPE = 6,
            READ_LOCALITY = 7;

        private final Range range;
        private final File directory;      // the copy read: this host's broker's
        private final byte[] locality;     // "local" or "remote" (locality.py's ReadLocality)
        private final int[] columns;       // the required columns, as indexes into COLUMNS
        private final OnHeapColumnVector[] vectors;
        private final ColumnarBatch batch;
        private final byte[] topic;
        private final TreeMap<Long, File> segments = new TreeMap<>();
        private final CRC32C crc = new CRC32C();
        // read_committed: the aborted transactions meeting the range, as (producer id, first offset,
        // last offset) triples; empty otherwise.
        private long[] aborted = new long[0];
        private MappedByteBuffer mapped;
        private long segmentBase = -1;
        private int position;              // in the mapped segment
        private long next;                 // the next offset to return
        private byte[] records = new byte[0];
        private byte[] scratch = new byte[1 << 16];
        private int recordsEnd, recordAt;  // the current batch's records, decoded
        private long baseOffset, firstTimestamp, maxTimestamp;
        private int timestampType;

        RangeReader(Range range, String[] columns) {
            this.range = range;
            this.columns = new int[columns.length];
            for (int index = 0; index < columns.length; index++) {
                this.columns[index] = Arrays.asList(COLUMNS).indexOf(columns[index]);
                if (this.columns[index] < 0) throw new IllegalArgumentException("unknown column " + columns[index]);
            }
            this.topic = range.topic.getBytes(StandardCharsets.UTF_8);
            if (range.clustered()) {
                Path bootstrap = taskBootstrap(range);
                this.directory = bootstrap.resolve(range.relative).toFile();
                this.locality = (isLocal(range) ? "local" : "remote").getBytes(StandardCharsets.UTF_8);
                ReplicaState.waitUntilCovered(bootstrap, range, where());
            } else {
                checkHost(range);
                this.directory = new File(range.directory);
                this.locality = "local".getBytes(StandardCharsets.UTF_8);
            }
            try {
                listSegments();
                if (range.readCommitted) readAborted();
            } catch (IOException error) {
                throw new UncheckedIOException(error);
            }
            vectors = new OnHeapColumnVector[columns.length];
            for (int index = 0; index < columns.length; index++) {
                vectors[index] = new OnHeapColumnVector(ROWS_PER_BATCH,
                    SCHEMA_WITH_READ_LOCALITY.apply(columns[index]).dataType());
            }
            batch = new ColumnarBatch(vectors);
            next = range.start;
        }

        /**
         * The partition's segment files, as one consistent set. A compaction swap renames cleaned
         * segments over old ones and deletes the rest of each group while its manifest
         * (segments.py's SWAP_MANIFEST_FILE) exists; a listing taken meanwhile may hold the old
         * first segment of a group without its later ones and step over their records. So a
         * listing counts only when no manifest is there before it or after it and a second
         * listing finds the same files (names and inodes: a rename over a file changes its inode).
         */
        private void listSegments() throws IOException {
            File manifest = new File(directory, SWAP_MANIFEST_FILE);
            long deadline = System.nanoTime() + LISTING_WAIT_NANOS_MAX;
            while (true) {
                boolean swapping = manifest.exists();
                TreeMap<Long, Object> first = identities(directory);
                swapping |= manifest.exists();
                TreeMap<Long, Object> second = identities(directory);
                if (!swapping && first.equals(second)) {
                    segments.clear();
                    for (Long base : first.keySet()) {
                        segments.put(base, new File(directory, String.format("%020d.log", base)));
                    }
                    return;
                }
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException(where() + ": the segments of " + directory
                        + " kept changing (a compaction swap) for " + LISTING_WAIT_NANOS_MAX / 1_000_000 + " ms");
                }
                try {
                    Thread.sleep(LISTING_RETRY_MILLIS);
                } catch (InterruptedException error) {
                    Thread.currentThread().interrupt();
                    throw new IOException(where() + ": interrupted while listing segments", error);
                }
            }
        }

        /**
         * The aborted transactions of the partition that meet the range, from every .txnindex file in
         * its directory. The plan ends at or below a last stable offset, which the broker publishes
         * only after the index entries of the transactions below it: every abort that matters is
         * there. As a reader of transaction_index_layout.py, it stops at a torn or invalid tail.
         */
        private void readAborted() throws IOException {
            File[] files = directory.listFiles((dir, name) -> name.matches("\\d{20}\\" + TXN_INDEX_SUFFIX));
            ArrayList<long[]> found = new ArrayList<>();
            for (File file : files == null ? new File[0] : files) {
                byte[] bytes;
                try {
                    bytes = Files.readAllBytes(file.toPath());
                } catch (NoSuchFileException gone) {
                    continue;                       // its segment was deleted (retention): below the range
                }
                ByteBuffer entries = ByteBuffer.wrap(bytes).order(ByteOrder.BIG_ENDIAN);
                long previous = Long.MIN_VALUE;
                for (int at = 0; at + TXN_ENTRY_LENGTH <= bytes.length; at += TXN_ENTRY_LENGTH) {
                    long first = entries.getLong(at + TXN_FIRST_OFFSET), last = entries.getLong(at + TXN_LAST_OFFSET);
                    if (entries.getShort(at) != TXN_VERSION || first < 0 || first > last || last <= previous) break;
                    previous = last;
                    if (last >= range.start && first < range.end) {
                        found.add(new long[] {entries.getLong(at + TXN_PRODUCER_ID), first, last});
                    }
                }
            }
            aborted = new long[3 * found.size()];
            for (int index = 0; index < found.size(); index++) {
                System.arraycopy(found.get(index), 0, aborted, 3 * index, 3);
            }
        }

        /** Whether the batch of producerId at baseOffset belongs to an aborted transaction. */
        private boolean isAborted(long producerId, long baseOffset) {
            for (int at = 0; at < aborted.length; at += 3) {
                if (aborted[at] == producerId && aborted[at + 1] <= baseOffset && baseOffset <= aborted[at + 2]) {
                    return true;
                }
            }
            return false;
        }

        /** Base offset -> file key (inode) of every segment log there now. */
        private TreeMap<Long, Object> identities(File directory) throws IOException {
            File[] files = directory.listFiles((dir, name) -> name.matches("\\d{20}\\.log"));
            if (files == null) throw new IllegalStateException(where() + ": no partition directory " + directory + " on host " + executorHost());
            TreeMap<Long, Object> found = new TreeMap<>();
            for (File file : files) {
                try {
                    found.put(Long.parseLong(file.getName().substring(0, 20)),
                        Files.readAttributes(file.toPath(), BasicFileAttributes.class).fileKey());
                } catch (NoSuchFileException gone) {
                    found.put(Long.parseLong(file.getName().substring(0, 20)), gone.getMessage());
                }
            }
            return found;
        }

        /** This host's broker's data directory: SHMLOG_SPARK_BOOTSTRAP (locality.py), else the plan's. */
        private static Path taskBootstrap(Range range) {
            String given = System.getenv("SHMLOG_SPARK_BOOTSTRAP");
            String chosen = given == null || given.isEmpty() ? range.bootstrap : given;
            return Paths.get(chosen).toAbsolutePath().normalize();
        }

        /** The host this executor registered with: what Spark matched the preferred locations against. */
        static String executorHost() {
            SparkEnv env = SparkEnv.get();
            if (env != null) return env.blockManager().blockManagerId().host();
            try {
                return InetAddress.getLocalHost().getHostName();
            } catch (java.net.UnknownHostException error) {
                throw new UncheckedIOException(error);
            }
        }

        private static boolean isLocal(Range range) {
            return List.of(range.hosts).contains(executorHost());
        }

        private static void checkHost(Range range) {
            try {
                String here = InetAddress.getLocalHost().getHostName();
                if (!here.equals(range.host)) {
                    throw new IllegalStateException("shmlog " + range.topic + "-" + range.partition + " is stored on "
                        + range.host + " but this task runs on " + here + ": run the executors on the broker hosts");
                }
            } catch (java.net.UnknownHostException error) {
                throw new UncheckedIOException(error);
            }
        }

        private String where() { return "shmlog " + range.topic + "-" + range.partition; }

        private void openSegmentFor(long offset) throws IOException {
            Map.Entry<Long, File> entry = segments.floorEntry(offset);
            if (entry == null) throw new IllegalStateException(where() + ": offset " + offset + " was deleted (retention)");
            try (RandomAccessFile file = new RandomAccessFile(entry.getValue(), "r"); FileChannel channel = file.getChannel()) {
                mapped = channel.map(FileChannel.MapMode.READ_ONLY, 0, channel.size());
            } catch (FileNotFoundException gone) {
                // Compaction replaced the segments since they were listed: the cleaned copy that
                // holds this offset now starts at or below it. (Retention is refused above.)
                listSegments();
                Map.Entry<Long, File> fresh = segments.floorEntry(offset);
                if (fresh == null) {
                    throw new IllegalStateException(where() + ": offset " + offset + " was deleted (retention)");
                }
                openSegmentFor(offset);
                return;
            }
            mapped.order(ByteOrder.LITTLE_ENDIAN);
            segmentBase = entry.getKey();
            position = 0;
        }

        /** Decode the next batch holding offsets >= next into records; false at the end of the segment. */
        private boolean loadBatch() throws IOException {
            while (true) {
                if (position + HEADER_LENGTH > mapped.capacity() || mapped.getInt(position + BATCH_LENGTH) == 0) {
                    Long following = segments.higherKey(segmentBase);
                    if (following == null) {
                        // Below the planned end (a high watermark) there is no record left:
                        // compaction removed the rest of the range.
                        next = range.end;
                        return false;
                    }
                    openSegmentFor(following);
                    continue;
                }
                int length = mapped.getInt(position + BATCH_LENGTH);
                if (length < HEADER_LENGTH || position + (long) length > mapped.capacity()
                        || (mapped.getShort(position + MAGIC) & 0xFFFF) != MAGIC_VALUE || mapped.get(position + VERSION) != VERSION_VALUE) {
                    throw new IllegalStateException(where() + ": no valid batch at byte " + position + " of segment " + segmentBase);
                }
                int count = mapped.getInt(position + RECORD_COUNT);
                long base = mapped.getLong(position + BASE_OFFSET);
                long lastOffset = base + mapped.getInt(position + RECORD_COUNT + 4);
                int start = position;
                position += length;
                if (lastOffset < next) continue;
                if (scratch.length < length) scratch = new byte[Math.max(length, 2 * scratch.length)];
                byte[] bytes = scratch;             // reused: the previous batch is fully read
                mapped.get(start, bytes, 0, length);
                crc.reset();
                crc.update(bytes, CRC_COVERED, length - CRC_COVERED);
                ByteBuffer header = ByteBuffer.wrap(bytes, 0, length).order(ByteOrder.LITTLE_ENDIAN);
                if ((int) crc.getValue() != header.getInt(CRC)) {
                    throw new IllegalStateException(where() + ": CRC mismatch in the batch at byte " + start + " of segment " + segmentBase);
                }
                int attributes = header.getShort(ATTRIBUTES) & 0xFFFF;
                if ((attributes & CONTROL_BIT) != 0) continue;   // a transaction's marker: no rows
                if ((attributes & TRANSACTIONAL_BIT) != 0 && aborted.length > 0
                        && isAborted(header.getLong(PRODUCER_ID), base)) {
                    continue;                                    // read_committed: an aborted transaction's
                }
                if ((attributes & CODEC_MASK) == CODEC_ZSTD) {
                    records = Zstd.decompress(Arrays.copyOfRange(bytes, HEADER_LENGTH, length),
                        (int) Zstd.getFrameContentSize(bytes, HEADER_LENGTH, length - HEADER_LENGTH));
                    recordAt = 0;
                    recordsEnd = records.length;
                } else {
                    records = bytes;
                    recordAt = HEADER_LENGTH;
                    recordsEnd = length;
                }
                baseOffset = base;
                firstTimestamp = header.getLong(FIRST_TIMESTAMP);
                maxTimestamp = header.getLong(MAX_TIMESTAMP);
                timestampType = (attributes & TIMESTAMP_TYPE_BIT) != 0 ? 1 : 0;
                if (count == 0) continue;
                return true;
            }
        }

        @Override
        public boolean next() throws IOException {
            if (next >= range.end) return false;
            for (OnHeapColumnVector vector : vectors) vector.reset();
            if (mapped == null) openSegmentFor(next);
            int rows = 0;
            while (rows < ROWS_PER_BATCH && next < range.end) {
                if (recordAt >= recordsEnd && !loadBatch()) break;
                ByteBuffer view = ByteBuffer.wrap(records).order(ByteOrder.LITTLE_ENDIAN);
                while (recordAt < recordsEnd && rows < ROWS_PER_BATCH && next < range.end) {
                    int at = recordAt;
                    recordAt += view.getInt(at + RECORD_LENGTH);
                    long offset = baseOffset + (view.getInt(at + OFFSET_DELTA) & 0xFFFFFFFFL);
                    if (offset < next) continue;
                    if (offset >= range.end) {      // compaction left a gap up to the end
                        next = range.end;
                        break;
                    }
                    int keyLength = view.getInt(at + KEY_LENGTH), valueLength = view.getInt(at + VALUE_LENGTH);
                    int keyAt = at + RECORD_HEADER_LENGTH, valueAt = keyAt + Math.max(keyLength, 0);
                    for (int column = 0; column < columns.length; column++) {
                        OnHeapColumnVector vector = vectors[column];
                        switch (columns[column]) {
                            case KEY: putBinary(vector, rows, keyAt, keyLength); break;
                            case VALUE: putBinary(vector, rows, valueAt, valueLength); break;
                            case TOPIC: vector.putByteArray(rows, topic); break;
                            case PARTITION: vector.putInt(rows, range.partition); break;
                            case OFFSET: vector.putLong(rows, offset); break;
                            // LogAppendTime: every record has the batch's append time.
                            case TIMESTAMP: vector.putLong(rows, (timestampType == 1 ? maxTimestamp
                                : firstTimestamp + view.getLong(at + TIMESTAMP_DELTA)) * 1000); break;
                            case TIMESTAMP_TYPE: vector.putInt(rows, timestampType); break;
                            default: vector.putByteArray(rows, locality); break;
                        }
                    }
                    rows++;
                    next = offset + 1;
                }
            }
            batch.setNumRows(rows);
            if (rows == 0 && next < range.end) throw new IllegalStateException(where() + ": nothing at offset " + next);
            return rows > 0;
        }

        private void putBinary(OnHeapColumnVector vector, int row, int at, int length) {
            if (length < 0) vector.putNull(row);
            else vector.putByteArray(row, records, at, length);
        }

        @Override public ColumnarBatch get() { return batch; }
        @Override public void close() { batch.close(); mapped = null; }
    }

    /**
     * A broker's copy of a partition as its state table (shmlog/shm/state_layout.py) shows it: the row
     * whose topic key and partition are the range's, and the high watermark in it, loaded with
     * acquire ordering ("a high watermark covers bytes already in the segment files"). The table is
     * /dev/shm/shmlog-[sha1 of the data directory, 12 hex digits]-state (paths.py, partition_host.py).
     */
    static final class ReplicaState {
        // ROWS is state_layout.ROWS_OFFSET: the 4 KiB control page and the journal of changed rows
        // (STATE_JOURNAL_CAPACITY slots of 8 bytes) come before the rows (layout version 5: two lines per row).
        static final int ROW_CAPACITY = 8, ROWS = 4096 + (1 << 14) * 8, ROW_SIZE = 128, HIGH_WATERMARK = 16,
            TOPIC_KEY = 40, PARTITION = 48, LAST_STABLE_OFFSET = 64;
        static final VarHandle LONGS = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);

        static String tableName(Path bootstrap) {
            try {
                byte[] digest = MessageDigest.getInstance("SHA-1").digest(bootstrap.toString().getBytes(StandardCharsets.UTF_8));
                return "shmlog-" + HexFormat.of().formatHex(digest).substring(0, 12) + "-state";
            } catch (NoSuchAlgorithmException error) {
                throw new IllegalStateException(error);
            }
        }

        /**
         * Return once the copy's high watermark (in read_committed its last stable offset, stored before
         * the high watermark and never above it) reaches range.end; else fail naming the host and partition.
         */
        static void waitUntilCovered(Path bootstrap, Range range, String where) {
            String host = RangeReader.executorHost();
            File table = new File("/dev/shm", tableName(bootstrap));
            MappedByteBuffer mapped;
            try (RandomAccessFile file = new RandomAccessFile(table, "r"); FileChannel channel = file.getChannel()) {
                mapped = channel.map(FileChannel.MapMode.READ_ONLY, 0, channel.size());
            } catch (IOException error) {
                throw new IllegalStateException(where + ": no shmlog broker at " + bootstrap + " on host " + host
                    + " (no state table " + table + "): run the executors on the broker hosts, each with "
                    + "SHMLOG_SPARK_BOOTSTRAP naming its host's broker", error);
            }
            mapped.order(ByteOrder.LITTLE_ENDIAN);
            int row = findRow(mapped, range);
            if (row < 0) {
                throw new IllegalStateException(where + ": the broker at " + bootstrap + " on host " + host
                    + " holds no copy of it");
            }
            long deadline = System.nanoTime() + range.waitMs * 1_000_000L;
            while (true) {
                int word = range.readCommitted ? LAST_STABLE_OFFSET : HIGH_WATERMARK;
                long highWatermark = (long) LONGS.getAcquire(mapped, ROWS + row * ROW_SIZE + word);
                if (highWatermark >= range.end) return;
                if (System.nanoTime() > deadline) {
                    throw new IllegalStateException(where + ": the copy at " + bootstrap + " on host " + host
                        + " has " + (range.readCommitted ? "last stable offset " : "high watermark ") + highWatermark
                        + ", below the planned end " + range.end
                        + ", after " + range.waitMs + " ms (is its broker fetching from the leader?)");
                }
                try {
                    Thread.sleep(range.pollMs);
                } catch (InterruptedException error) {
                    Thread.currentThread().interrupt();
                    throw new IllegalStateException(where + ": interrupted while waiting for its high watermark", error);
                }
            }
        }

        private static int findRow(MappedByteBuffer mapped, Range range) {
            long capacity = mapped.getLong(ROW_CAPACITY);
            for (int row = 0; row < capacity; row++) {
                int at = ROWS + row * ROW_SIZE;
                if ((long) LONGS.getAcquire(mapped, at + TOPIC_KEY) == range.topicKey
                        && mapped.getLong(at + PARTITION) == range.partition) {
                    return row;
                }
            }
            return -1;
        }
    }
}
