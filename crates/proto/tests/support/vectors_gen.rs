//! The golden-vector cases: built here, written by `examples/gen_vectors.rs`, checked by
//! `tests/vectors.rs` (and read by the Java tests). Changing a case changes the files.

use bytes::{BufMut, BytesMut};
use serde_json::{json, Value};
use sluice_proto::batch::put_batch;
use sluice_proto::message::*;
use sluice_proto::{encode_frame, ErrorCode, DEFAULT_MAX_FRAME_BYTES, HANDSHAKE_MAX_FRAME_BYTES};

/// One vector: its file bytes and its manifest entry.
pub struct Case {
    pub name: String,
    pub bytes: Vec<u8>,
    pub manifest: Value,
}

fn batches(parts: &[(u32, u32, u32, &[u8])]) -> Vec<u8> {
    let mut out = BytesMut::new();
    for (m, a, b, p) in parts {
        put_batch(&mut out, *m, *a, *b, p);
    }
    out.to_vec()
}

fn ok(name: &str, request_id: u32, msg: Message, body: &[u8], validate_batches: bool) -> Case {
    let bytes = encode_frame(request_id, &msg, body).to_vec();
    let fields = serde_json::to_value(&msg).expect("message serializes");
    let manifest = json!({
        "name": name, "file": format!("{name}.bin"), "message": msg.msg_type().name(),
        "msg_type": msg.msg_type() as u8, "request_id": request_id,
        "max_frame_bytes": DEFAULT_MAX_FRAME_BYTES, "validate_batches": validate_batches,
        "fields": fields, "body_hex": hex::encode(body), "expect": "ok",
    });
    Case { name: name.into(), bytes, manifest }
}

fn bad(
    name: &str,
    bytes: Vec<u8>,
    max: u32,
    validate: bool,
    expect: &str,
    code: ErrorCode,
    why: &str,
) -> Case {
    let mut manifest = json!({
        "name": name, "file": format!("{name}.bin"), "max_frame_bytes": max,
        "validate_batches": validate, "expect": expect, "description": why,
    });
    let key = if expect == "incomplete" { "expect_at_eof" } else { "error_code" };
    manifest[key] = json!(code.as_u16());
    manifest[format!("{key}_name")] = json!(code.name());
    Case { name: name.into(), bytes, manifest }
}

/// A raw frame with hand-chosen header values, for malformed cases.
fn raw(frame_len: u32, ty: u8, request_id: u32, fields_len: u32, rest: &[u8]) -> Vec<u8> {
    let mut out = BytesMut::new();
    out.put_u32(frame_len);
    out.put_u8(ty);
    out.put_u32(request_id);
    out.put_u32(fields_len);
    out.put_slice(rest);
    out.to_vec()
}

fn fields_of(msg: &Message) -> Vec<u8> {
    let mut f = BytesMut::new();
    msg.encode_fields(&mut f);
    f.to_vec()
}

pub fn cases() -> Vec<Case> {
    let app = || "app-20261122-0001".to_string();
    let two = batches(&[(0, 0, 0, b"hello, sluice"), (1, 0, 0, b"second map")]);
    let merged_a = batches(&[(4, 1, 0, b"partition two")]);
    let merged_b = batches(&[(4, 1, 0, b"partition five"), (4, 1, 1, b"more")]);
    let mut merged = merged_a.clone();
    merged.extend_from_slice(&merged_b);
    let hs = Handshake {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        features: FEATURE_CRC32C,
        max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
        app_id: app(),
        client_nonce: "5f1c0a9e7d2b4c68".into(),
    };
    let mut v = vec![
        ok("handshake", 1, hs.clone().into(), &[], false),
        ok(
            "handshake_ok",
            1,
            HandshakeOk { version: 1, features: FEATURE_CRC32C, max_frame_bytes: 16 << 20 }.into(),
            &[],
            false,
        ),
        ok(
            "error",
            9,
            Message::error(ErrorCode::UnknownShuffle, "shuffle 3 of app-1 is not registered"),
            &[],
            false,
        ),
        ok(
            "auth_challenge",
            1,
            AuthChallenge { server_nonce: "9b2e4f7a1c3d5e8f0a1b2c3d4e5f6a7b".into() }.into(),
            &[],
            false,
        ),
        ok(
            "auth_proof",
            2,
            AuthProof {
                proof: "0f4c2a6b8d1e3f5a7c9e0b2d4f6a8c1e3b5d7f9a0c2e4b6d8f1a3c5e7b9d0f2a".into(),
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "error_unauthorized",
            10,
            Message::error(
                ErrorCode::Unauthorized,
                "this connection is authenticated for app-a, not app-b",
            ),
            &[],
            false,
        ),
        ok(
            "error_quota_exceeded",
            11,
            Message::error(
                ErrorCode::QuotaExceeded,
                "application app-a is over its quota app.disk_bytes: 1073741824 bytes",
            ),
            &[],
            false,
        ),
        ok("ping", 2, Ping {}.into(), &[], false),
        ok("pong", 2, Pong {}.into(), &[], false),
        ok("ok", 3, OkMsg {}.into(), &[], false),
        ok(
            "register_server",
            4,
            RegisterServer {
                server_id: "srv-a".into(),
                host: "127.0.0.1".into(),
                port: 9097,
                memory_budget_bytes: 1 << 30,
                disk_capacity_bytes: 500 << 30,
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "server_heartbeat",
            5,
            ServerHeartbeat {
                server_id: "srv-a".into(),
                host: "127.0.0.1".into(),
                port: 9097,
                memory_budget_bytes: 1 << 30,
                free_memory_bytes: 900 << 20,
                free_disk_bytes: 400 << 30,
                partitions_held: 42,
                push_bytes_per_s: 123_456_789,
                active_connections: 7,
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "server_status",
            5,
            ServerStatus {
                server_id: "srv-a".into(),
                draining: 1,
                shuffles_held: 3,
                disks: vec![
                    DiskReport {
                        path: "/data/1".into(),
                        free_bytes: 400 << 30,
                        capacity_bytes: 1 << 40,
                        state: DISK_IN_SERVICE,
                    },
                    DiskReport {
                        path: "/data/2".into(),
                        free_bytes: 0,
                        capacity_bytes: 1 << 40,
                        state: DISK_FAILED,
                    },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok("drain_order", 5, DrainOrder { order: DRAIN_ORDER_START }.into(), &[], false),
        ok(
            "quota_report",
            5,
            QuotaReport {
                server_id: "srv-a".into(),
                at_quota: vec![
                    AtQuota {
                        holder: QUOTA_HOLDER_APP,
                        name: "app-1".into(),
                        quota: "disk_bytes".into(),
                        limit_bytes: 2 << 20,
                        held_bytes: (2 << 20) - 100,
                    },
                    AtQuota {
                        holder: QUOTA_HOLDER_USER,
                        name: "alice".into(),
                        quota: "buffered_bytes".into(),
                        limit_bytes: 1 << 30,
                        held_bytes: 1 << 30,
                    },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "register_app",
            6,
            RegisterApp { app_id: app(), user: "alice".into() }.into(),
            &[],
            false,
        ),
        ok("app_heartbeat", 7, AppHeartbeat { app_id: app() }.into(), &[], false),
        ok("unregister_app", 8, UnregisterApp { app_id: app() }.into(), &[], false),
        ok(
            "register_shuffle",
            10,
            RegisterShuffle {
                app_id: app(),
                shuffle_id: 3,
                num_maps: 200,
                num_partitions: 4,
                replication: 1,
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "assignment",
            10,
            Assignment {
                shuffle_id: 3,
                servers: vec![
                    ServerAddr { server_id: "srv-a".into(), host: "127.0.0.1".into(), port: 9097 },
                    ServerAddr { server_id: "srv-b".into(), host: "127.0.0.1".into(), port: 9098 },
                ],
                partitions: vec![
                    PartitionLoc { primary: 0, replica: 1 },
                    PartitionLoc { primary: 1, replica: 0 },
                    PartitionLoc { primary: 0, replica: NO_REPLICA },
                    PartitionLoc { primary: 1, replica: NO_REPLICA },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "shuffle_sync",
            13,
            ShuffleSync {
                want_all: 1,
                shuffles: vec![SyncedShuffle {
                    app_id: app(),
                    num_maps: 200,
                    replication: 2,
                    assignment: Assignment {
                        shuffle_id: 3,
                        servers: vec![
                            ServerAddr {
                                server_id: "srv-a".into(),
                                host: "127.0.0.1".into(),
                                port: 9097,
                            },
                            ServerAddr {
                                server_id: "srv-b".into(),
                                host: "127.0.0.1".into(),
                                port: 9098,
                            },
                        ],
                        partitions: vec![
                            PartitionLoc { primary: 0, replica: 1 },
                            PartitionLoc { primary: 1, replica: 0 },
                        ],
                    },
                }],
                removed_apps: vec!["app-gone".into()],
                removed_shuffles: vec![UnregisterShuffle { app_id: app(), shuffle_id: 2 }],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "split_partition",
            21,
            SplitPartition { app_id: app(), shuffle_id: 3, partition_id: 7, known_parts: 1 }.into(),
            &[],
            false,
        ),
        ok("get_splits", 22, GetSplits { app_id: app(), shuffle_id: 3 }.into(), &[], false),
        ok(
            "splits",
            22,
            Splits {
                app_id: app(),
                shuffle_id: 3,
                partitions: vec![
                    SplitParts {
                        partition_id: 7,
                        parts: vec![
                            PartitionLoc { primary: 0, replica: NO_REPLICA },
                            PartitionLoc { primary: 2, replica: NO_REPLICA },
                        ],
                    },
                    SplitParts {
                        partition_id: 9,
                        parts: vec![
                            PartitionLoc { primary: 1, replica: 0 },
                            PartitionLoc { primary: 2, replica: 3 },
                            PartitionLoc { primary: 4, replica: 5 },
                        ],
                    },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok("get_assignment", 11, GetAssignment { app_id: app(), shuffle_id: 3 }.into(), &[], false),
        ok("commit_shuffle", 12, CommitShuffle { app_id: app(), shuffle_id: 3 }.into(), &[], false),
        ok(
            "commit_result",
            12,
            CommitResult {
                shuffle_id: 3,
                partitions: vec![
                    PartitionSize { partition: 0, bytes: 1 << 33 },
                    PartitionSize { partition: 2, bytes: 77 },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "unregister_shuffle",
            13,
            UnregisterShuffle { app_id: app(), shuffle_id: 3 }.into(),
            &[],
            false,
        ),
        ok("push", 14, Push { app_id: app(), shuffle_id: 3, partition_id: 1 }.into(), &two, true),
        ok(
            "push_merged_two_sections",
            15,
            PushMerged {
                app_id: app(),
                shuffle_id: 3,
                entries: vec![
                    Section { partition_id: 2, offset: 0, length: merged_a.len() as u32 },
                    Section {
                        partition_id: 5,
                        offset: merged_a.len() as u32,
                        length: merged_b.len() as u32,
                    },
                ],
            }
            .into(),
            &merged,
            true,
        ),
        ok("push_ack", 15, PushAck {}.into(), &[], false),
        ok("busy", 16, Busy { backoff_ms: 250 }.into(), &[], false),
        ok(
            "mapper_end",
            17,
            MapperEnd {
                app_id: app(),
                shuffle_id: 3,
                map_id: 4,
                attempt_id: 1,
                batch_counts: vec![
                    BatchCount { partition_id: 2, batches: 1 },
                    BatchCount { partition_id: 5, batches: 2 },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok("mapper_end_result", 17, MapperEndResult { winning_attempt: 1 }.into(), &[], false),
        ok(
            "open_stream",
            18,
            OpenStream {
                app_id: app(),
                shuffle_id: 3,
                partition_id: 5,
                map_start: 0,
                map_end: 200,
                attempts: vec![
                    MapAttempt { map_id: 4, attempt_id: 1 },
                    MapAttempt { map_id: 9, attempt_id: 0x8000_0007 },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "stream_handle",
            18,
            StreamHandle {
                stream_id: 0x0102_0304_0506_0708,
                chunk_lengths: vec![4 << 20, 1234],
                committed: vec![
                    CommittedMap { map_id: 4, attempt_id: 1, batches: 2 },
                    CommittedMap { map_id: 9, attempt_id: 0, batches: 17 },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok(
            "fetch_chunk",
            19,
            FetchChunk { stream_id: 0x0102_0304_0506_0708, chunk_index: 1 }.into(),
            &[],
            false,
        ),
        ok(
            "chunk_data",
            19,
            ChunkData { stream_id: 0x0102_0304_0506_0708, chunk_index: 1 }.into(),
            &merged_b,
            true,
        ),
        ok(
            "fetch_chunk_local",
            19,
            FetchChunkLocal { stream_id: 0x0102_0304_0506_0708, chunk_index: 2 }.into(),
            &[],
            false,
        ),
        ok(
            "chunk_local",
            19,
            ChunkLocal {
                stream_id: 0x0102_0304_0506_0708,
                chunk_index: 2,
                path: "/data/sluice/app-20261122-0001/3/7-0.data".into(),
                device: 0x0000_0000_0000_fd01,
                inode: 0x0000_0001_0203_0405,
                spans: vec![
                    FileSpan { offset: 0, length: 4096 },
                    FileSpan { offset: 0x1_0000_0000, length: 77 },
                ],
            }
            .into(),
            &[],
            false,
        ),
        ok("push_split", 15, PushSplit { partitions: vec![2, 5] }.into(), &[], false),
        ok("close_stream", 20, CloseStream { stream_id: 0x0102_0304_0506_0708 }.into(), &[], false),
    ];

    let max = DEFAULT_MAX_FRAME_BYTES;
    let push = Message::from(Push { app_id: app(), shuffle_id: 3, partition_id: 1 });
    let push_frame = encode_frame(14, &push, &two).to_vec();
    let mut bad_crc = two.clone();
    bad_crc[20] ^= 0x01; // first payload byte of the first batch
    let mut bad_crc_frame = encode_frame(14, &push, &[]).to_vec();
    bad_crc_frame.splice(0..4, ((bad_crc_frame.len() + bad_crc.len()) as u32).to_be_bytes());
    bad_crc_frame.extend_from_slice(&bad_crc);
    let mut short_batch = batches(&[(0, 0, 0, b"complete")]);
    short_batch.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]); // says 256 bytes follow
    short_batch.extend_from_slice(b"only a few");
    let short_batch_frame = encode_frame(14, &push, &short_batch).to_vec();
    let mut old_hs = hs.clone();
    old_hs.version = 2;
    let mut magic_hs = hs.clone();
    magic_hs.magic = 0x4854_5450; // "HTTP"
    let get = fields_of(&GetAssignment { app_id: "a".into(), shuffle_id: 1 }.into());
    let mut trailing = get.clone();
    trailing.push(0xAA);
    let merged_out = PushMerged {
        app_id: app(),
        shuffle_id: 3,
        entries: vec![Section { partition_id: 2, offset: 8, length: 0xFFFF_FFF8 }],
    };
    // The same bytes counted twice: the second section starts inside the first.
    let merged_overlap = PushMerged {
        app_id: app(),
        shuffle_id: 3,
        entries: vec![
            Section { partition_id: 2, offset: 0, length: merged_a.len() as u32 },
            Section { partition_id: 5, offset: 0, length: merged.len() as u32 },
        ],
    };
    let merged_empty = PushMerged {
        app_id: app(),
        shuffle_id: 3,
        entries: vec![
            Section { partition_id: 2, offset: 0, length: merged.len() as u32 },
            Section { partition_id: 5, offset: merged.len() as u32, length: 0 },
        ],
    };
    let mut bad_utf8 = vec![0, 2, 0xC3, 0x28];
    bad_utf8.extend_from_slice(&[0, 0, 0, 1]);
    let error_flag = {
        let mut f = fields_of(&Message::error(ErrorCode::Internal, "x"));
        f[2] = 2;
        f
    };
    let drain_order_unknown = vec![3u8];
    let quota_holder_unknown = {
        let mut f = fields_of(
            &QuotaReport {
                server_id: "s".into(),
                at_quota: vec![AtQuota { holder: QUOTA_HOLDER_USER, ..Default::default() }],
            }
            .into(),
        );
        // server_id (2 + 1 bytes), the list's count (4): the entry's holder.
        f[7] = 2;
        f
    };
    let bad_index = fields_of(
        &Assignment {
            shuffle_id: 1,
            servers: vec![ServerAddr { server_id: "s".into(), host: "h".into(), port: 1 }],
            partitions: vec![PartitionLoc { primary: 1, replica: NO_REPLICA }],
        }
        .into(),
    );
    let zero_parts = fields_of(
        &RegisterShuffle {
            app_id: "a".into(),
            shuffle_id: 1,
            num_maps: 1,
            num_partitions: 0,
            replication: 1,
        }
        .into(),
    );
    let split_no_parts = fields_of(
        &Splits {
            app_id: "a".into(),
            shuffle_id: 1,
            partitions: vec![SplitParts { partition_id: 0, parts: vec![] }],
        }
        .into(),
    );
    let backwards = fields_of(
        &OpenStream {
            app_id: "a".into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start: 5,
            map_end: 4,
            attempts: vec![],
        }
        .into(),
    );
    let attempts_unsorted = fields_of(
        &OpenStream {
            app_id: "a".into(),
            shuffle_id: 1,
            partition_id: 0,
            map_start: 0,
            map_end: 10,
            attempts: vec![
                MapAttempt { map_id: 7, attempt_id: 0 },
                MapAttempt { map_id: 7, attempt_id: 1 },
            ],
        }
        .into(),
    );
    let mut count_overflow = 7u32.to_be_bytes().to_vec(); // shuffle_id
    count_overflow.extend_from_slice(&u32::MAX.to_be_bytes()); // servers count
    count_overflow.extend_from_slice(&[0; 8]);
    let f = |fields: &[u8]| 13 + fields.len() as u32;

    v.extend([
        bad(
            "truncated_header",
            push_frame[..7].to_vec(),
            max,
            false,
            "incomplete",
            ErrorCode::MalformedFrame,
            "7 of the 13 header bytes",
        ),
        bad(
            "truncated_body",
            push_frame[..push_frame.len() - 9].to_vec(),
            max,
            false,
            "incomplete",
            ErrorCode::MalformedFrame,
            "frame_len promises 9 more body bytes than the stream holds",
        ),
        bad(
            "frame_len_below_header",
            raw(12, 4, 1, 0, &[]),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "frame_len 12 is shorter than the header",
        ),
        bad(
            "frame_len_over_max",
            raw(1 << 30, 30, 1, 0, &[]),
            HANDSHAKE_MAX_FRAME_BYTES,
            false,
            "error",
            ErrorCode::FrameTooLarge,
            "1 GiB frame against a 64 KiB limit; rejected from the header alone",
        ),
        bad(
            "unknown_type",
            raw(13, 99, 1, 0, &[]),
            max,
            false,
            "error",
            ErrorCode::UnknownMessageType,
            "type id 99 is not a v1 message",
        ),
        bad(
            "fields_len_past_frame",
            raw(f(&get), 17, 1, get.len() as u32 + 1, &get),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "fields_len runs one byte past frame_len",
        ),
        bad(
            "fields_truncated",
            raw(f(&get[..get.len() - 2]), 17, 1, get.len() as u32 - 2, &get[..get.len() - 2]),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "GetAssignment whose fields stop inside shuffle_id",
        ),
        bad(
            "fields_trailing_bytes",
            raw(f(&trailing), 17, 1, trailing.len() as u32, &trailing),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "one byte after the last field",
        ),
        bad(
            "body_on_bodiless_message",
            raw(f(&get) + 3, 17, 1, get.len() as u32, &[get.as_slice(), b"xyz"].concat()),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "GetAssignment with a 3-byte body",
        ),
        bad(
            "handshake_unsupported_version",
            encode_frame(1, &old_hs.into(), &[]).to_vec(),
            HANDSHAKE_MAX_FRAME_BYTES,
            false,
            "error",
            ErrorCode::UnsupportedVersion,
            "handshake for protocol version 2",
        ),
        bad(
            "handshake_bad_magic",
            encode_frame(1, &magic_hs.into(), &[]).to_vec(),
            HANDSHAKE_MAX_FRAME_BYTES,
            false,
            "error",
            ErrorCode::UnsupportedVersion,
            "handshake whose magic is not SLCE",
        ),
        bad(
            "list_count_overflow",
            raw(f(&count_overflow), 16, 1, count_overflow.len() as u32, &count_overflow),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "Assignment claiming 4294967295 servers in 8 bytes; must fail before allocating",
        ),
        bad(
            "push_merged_section_outside_body",
            encode_frame(15, &merged_out.into(), &merged).to_vec(),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "section offset+length overflows u32 and runs past the body",
        ),
        bad(
            "push_merged_sections_overlap",
            encode_frame(15, &merged_overlap.into(), &merged).to_vec(),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "the second section starts inside the first: its bytes would be stored twice",
        ),
        bad(
            "push_merged_section_empty",
            encode_frame(15, &merged_empty.into(), &merged).to_vec(),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "a section of no bytes",
        ),
        bad(
            "string_not_utf8",
            raw(f(&bad_utf8), 17, 1, bad_utf8.len() as u32, &bad_utf8),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "app_id bytes C3 28 are not UTF-8",
        ),
        bad(
            "error_retriable_not_bool",
            raw(f(&error_flag), 3, 1, error_flag.len() as u32, &error_flag),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "Error.retriable is 2",
        ),
        bad(
            "assignment_index_outside_servers",
            raw(f(&bad_index), 16, 1, bad_index.len() as u32, &bad_index),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "primary index 1 with one server",
        ),
        bad(
            "register_shuffle_zero_partitions",
            raw(f(&zero_parts), 15, 1, zero_parts.len() as u32, &zero_parts),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "num_partitions 0",
        ),
        bad(
            "splits_partition_without_parts",
            raw(f(&split_no_parts), 28, 1, split_no_parts.len() as u32, &split_no_parts),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "a split partition with an empty part list",
        ),
        bad(
            "open_stream_range_backwards",
            raw(f(&backwards), 36, 1, backwards.len() as u32, &backwards),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "map_start 5 > map_end 4",
        ),
        bad(
            "open_stream_attempts_repeat_a_map",
            raw(f(&attempts_unsorted), 36, 1, attempts_unsorted.len() as u32, &attempts_unsorted),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "map 7 listed twice: attempts must name maps in ascending order",
        ),
        bad(
            "drain_order_unknown",
            raw(f(&drain_order_unknown), 22, 1, 1, &drain_order_unknown),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "DrainOrder.order is 3",
        ),
        bad(
            "quota_report_unknown_holder",
            raw(f(&quota_holder_unknown), 23, 1, 1, &quota_holder_unknown),
            max,
            false,
            "error",
            ErrorCode::MalformedFrame,
            "QuotaReport holder 2 (neither application nor user)",
        ),
        bad(
            "batch_crc_mismatch",
            bad_crc_frame,
            max,
            true,
            "error",
            ErrorCode::ChecksumMismatch,
            "one payload bit flipped; the frame is well formed, its batch is not",
        ),
        bad(
            "batch_length_past_body",
            short_batch_frame,
            max,
            true,
            "error",
            ErrorCode::MalformedFrame,
            "second batch header promises 256 payload bytes, 10 follow",
        ),
    ]);
    v
}

/// The manifest file's text.
pub fn manifest(cases: &[Case]) -> String {
    let doc = json!({
        "protocol_version": PROTOCOL_VERSION,
        "note": "Generated by `cargo run -p sluice-proto --example gen_vectors`; see docs/protocol.md.",
        "cases": cases.iter().map(|c| c.manifest.clone()).collect::<Vec<_>>(),
    });
    serde_json::to_string_pretty(&doc).expect("manifest serializes") + "\n"
}
