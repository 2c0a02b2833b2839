//! The Rust wrapper over the C ABI, on both builds of the reference backend: linked in
//! (builtin) and loaded from the shared library. Also runs the C test program, which
//! drives the shared library through the header alone.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use omni_actors::domain::{ChatMessage, DuplexChunk, Role, SessionKind, SessionSetup, StepKind, TurnInput};
use omni_actors::edge::backend::{Backend, BackendError, run_duplex_step};
use omni_actors::worker::WorkerThread;
use omni_backend_host::{BackendApi, LoadError};

const LIB: &str = env!("OMNI_REFERENCE_LIB");

fn builds() -> Vec<(&'static str, BackendApi)> {
    vec![
        ("builtin", BackendApi::builtin()),
        ("library", BackendApi::load(Path::new(LIB)).expect("load the shared build")),
    ]
}

fn opts(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn loud() -> Vec<f32> {
    (0..16000).map(|i| 0.3 * (2.0 * std::f32::consts::PI * 220.0 * i as f32 / 16000.0).sin()).collect()
}

fn quiet() -> Vec<f32> {
    vec![0.0; 16000]
}

fn chunk(audio: Vec<f32>) -> DuplexChunk {
    DuplexChunk { audio, ..DuplexChunk::default() }
}

fn duplex(api: &BackendApi, options: &[(&str, &str)]) -> Box<dyn Backend> {
    let mut b = api.open(&opts(options)).expect("open");
    b.prepare(&SessionSetup::new(SessionKind::Duplex)).expect("prepare");
    Box::new(b)
}

#[test]
fn the_c_program_drives_the_shared_library_through_the_header() {
    let out = Command::new(env!("OMNI_ABI_TEST_BIN")).arg(LIB).output().expect("run the C test program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "C ABI test failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(!stdout.contains("not ok"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("ok ")).count() >= 40, "{stdout}");
}

#[test]
fn info_reports_the_reference_capabilities() {
    for (build, api) in builds() {
        let b = api.open(&[]).unwrap();
        let info = b.info();
        assert_eq!(info.name, "omni-reference", "{build}");
        assert!(info.duplex && info.turn && info.vision && info.speech_output, "{build}");
        assert_eq!(
            (info.input_sample_rate, info.output_sample_rate, info.context_size),
            (16000, 24000, 8192),
            "{build}"
        );
    }
}

#[test]
fn listen_then_speak_then_listen() {
    for (build, api) in builds() {
        let mut b = duplex(&api, &[]);
        let first = run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
        assert_eq!(first.kind, StepKind::Listen, "{build}: loud input is listened to");
        assert_eq!(first.kv_length, 26, "{build}: 1 per step + 25 per second");
        let mut spoken = Vec::new();
        for _ in 0..3 {
            let s = run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap();
            assert_eq!(s.kind, StepKind::Speak, "{build}");
            assert!(!s.text.is_empty(), "{build}: every speaking step has text");
            assert!(s.audio.iter().map(|x| x.abs()).fold(0.0, f32::max) > 0.1, "{build}: audible, not silence");
            spoken.push((s.audio.len(), s.end_of_turn));
        }
        assert_eq!(spoken, vec![(24000, false), (24000, false), (12000, true)], "{build}");
        assert_eq!(run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind, StepKind::Listen, "{build}");
    }
}

#[test]
fn the_same_inputs_give_the_same_outputs() {
    // Everything but the measured timings: kind, text, audio bits, end of turn, KV length.
    let run = |api: &BackendApi| {
        let mut b = duplex(api, &[]);
        [loud(), quiet(), quiet(), quiet(), quiet()]
            .into_iter()
            .map(|a| {
                let s = run_duplex_step(b.as_mut(), &chunk(a)).unwrap();
                let bits: Vec<u32> = s.audio.iter().map(|x| x.to_bits()).collect();
                (s.kind, s.text, bits, s.end_of_turn, s.kv_length, s.input_tokens, s.output_tokens)
            })
            .collect::<Vec<_>>()
    };
    let [(_, builtin), (_, library)]: [(&str, BackendApi); 2] = builds().try_into().ok().unwrap();
    let first = run(&builtin);
    assert!(first == run(&builtin), "two runs of the builtin differ");
    assert!(first == run(&library), "the static and shared builds differ");
}

#[test]
fn force_listen_ends_speech_by_flag_and_from_another_thread() {
    for (build, api) in builds() {
        let mut b = duplex(&api, &[]);
        run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
        assert_eq!(run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind, StepKind::Speak);
        let forced = DuplexChunk { force_listen: true, ..chunk(quiet()) };
        assert_eq!(run_duplex_step(b.as_mut(), &forced).unwrap().kind, StepKind::Listen, "{build}: step flag");
        assert_eq!(
            run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind,
            StepKind::Listen,
            "{build}: speech is over"
        );

        run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
        assert_eq!(run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind, StepKind::Speak);
        let control = b.control();
        std::thread::spawn(move || control.set_force_listen(true)).join().unwrap();
        assert_eq!(
            run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind,
            StepKind::Listen,
            "{build}: any-thread call"
        );
    }
}

#[test]
fn a_force_listen_given_both_ways_is_consumed_once() {
    // The gateway force-listens a backend twice for one chunk: the any-thread call (to
    // overtake the backlog) and the chunk's flag. Both are consumed by that step: the
    // steps after it hear normally (a short-circuit once left the pending call for the
    // next step, which then lost the speech it heard).
    for (build, api) in builds() {
        let mut b = duplex(&api, &[]);
        b.control().set_force_listen(true);
        let forced = DuplexChunk { force_listen: true, ..chunk(quiet()) };
        assert_eq!(run_duplex_step(b.as_mut(), &forced).unwrap().kind, StepKind::Listen, "{build}");
        assert_eq!(run_duplex_step(b.as_mut(), &chunk(loud())).unwrap().kind, StepKind::Listen, "{build}: speech");
        assert_eq!(
            run_duplex_step(b.as_mut(), &chunk(quiet())).unwrap().kind,
            StepKind::Speak,
            "{build}: the speech after the force-listen was heard"
        );
    }
}

#[test]
fn any_thread_calls_reach_a_step_in_flight_on_the_worker_thread() {
    for (build, api) in builds() {
        let factory = {
            let api = api.clone();
            omni_actors::BackendFactory::new(move || {
                let mut b = api.open(&opts(&[("step_ms", "60000")]))?;
                b.prepare(&SessionSetup::new(SessionKind::Duplex))?;
                Ok(Box::new(b) as Box<dyn Backend>)
            })
        };
        let (mut worker, _, control) = WorkerThread::spawn_and_wait(build, factory).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        worker
            .submit(Box::new(move |b| {
                let _ = tx.send(run_duplex_step(b, &chunk(loud())));
            }))
            .unwrap();
        // The step sleeps for a minute; the KV length is readable meanwhile, and
        // interrupt cuts the step short.
        while control.kv_length() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(control.kv_length(), 26, "{build}");
        control.interrupt();
        let result = rx.recv_timeout(Duration::from_secs(50)).expect("the interrupted step returns");
        assert_eq!(result, Err(BackendError::Interrupted), "{build}");
    }
}

#[test]
fn context_full_with_a_small_context() {
    for (build, api) in builds() {
        let mut b = duplex(&api, &[("n_ctx", "60")]);
        run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
        run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
        match run_duplex_step(b.as_mut(), &chunk(loud())) {
            Err(BackendError::ContextFull(msg)) => {
                assert!(msg.contains("n_ctx 60"), "{build}: {msg}")
            }
            other => panic!("{build}: expected context full, got {other:?}"),
        }
        b.reset().unwrap();
        b.prepare(&SessionSetup::new(SessionKind::Duplex)).unwrap();
        assert!(run_duplex_step(b.as_mut(), &chunk(loud())).is_ok(), "{build}: reset empties the context");
    }
}

fn answer(b: &mut dyn Backend, input: &TurnInput) -> (String, usize, usize) {
    b.turn_prefill(input).unwrap();
    let (mut text, mut samples, mut pieces) = (String::new(), 0, 0);
    loop {
        let p = b.turn_generate().unwrap();
        text.push_str(&p.text);
        samples += p.audio.len();
        pieces += 1;
        if p.done {
            return (text, pieces, samples);
        }
    }
}

#[test]
fn turn_mode_answers() {
    for (build, api) in builds() {
        let mut b = api.open(&[]).unwrap();
        b.prepare(&SessionSetup::new(SessionKind::Turn)).unwrap();
        let ask =
            |text: &str| TurnInput { messages: vec![ChatMessage::text(Role::User, text)], ..TurnInput::default() };

        assert_eq!(answer(&mut b, &ask("Reply with exactly: test")), ("test".into(), 1, 0), "{build}");
        let (text, pieces, _) = answer(&mut b, &ask("tell me about the sea"));
        assert_eq!(text, "You said 5 words, and I have answered.", "{build}");
        assert_eq!(pieces, 8, "{build}: one piece per word");

        let media = TurnInput {
            messages: vec![
                ChatMessage::text(Role::System, "be brief"),
                ChatMessage {
                    role: Role::User,
                    text: String::new(),
                    images: vec![vec![0xff, 0xd8, 0xff]],
                    audios: vec![vec![0.0; 24000]],
                    call: None,
                },
            ],
            speech: true,
            ..TurnInput::default()
        };
        let (text, pieces, samples) = answer(&mut b, &media);
        assert_eq!(text, "I received 1.5 seconds of audio and 1 image.", "{build}");
        assert_eq!(samples, pieces * 6000, "{build}: each piece carries audio with speech on");

        let mut limited = ask("Reply with exactly: one two three four");
        limited.generation.max_new_tokens = Some(2);
        assert_eq!(answer(&mut b, &limited).0, "one two", "{build}: max_new_tokens stops the answer");
    }
}

#[test]
fn fail_at_step_fails_that_step_once() {
    for (build, api) in builds() {
        let mut b = duplex(&api, &[("fail_at_step", "2")]);
        assert!(run_duplex_step(b.as_mut(), &chunk(loud())).is_ok());
        match run_duplex_step(b.as_mut(), &chunk(loud())) {
            Err(BackendError::Inference(msg)) => assert!(msg.contains("step 2"), "{build}: {msg}"),
            other => panic!("{build}: expected an inference error, got {other:?}"),
        }
        assert!(run_duplex_step(b.as_mut(), &chunk(loud())).is_ok(), "{build}: the next step works");
    }
}

#[test]
fn hang_at_step_blocks_that_step_while_any_thread_calls_answer() {
    for (build, api) in builds() {
        let mut b = duplex(&api, &[("hang_at_step", "1"), ("hang_ms", "300")]);
        let control = b.control();
        let watcher = std::thread::spawn(move || {
            // Any-thread calls answer while the owner thread hangs (the step has begun
            // once its chunk is in the context).
            while control.kv_length() == 0 {
                std::thread::yield_now();
            }
            control.interrupt();
            control.kv_length()
        });
        let start = Instant::now();
        let result = run_duplex_step(b.as_mut(), &chunk(loud()));
        assert!(start.elapsed() >= Duration::from_millis(300), "{build}: the step blocked for hang_ms");
        assert_eq!(watcher.join().unwrap(), 26, "{build}");
        assert!(result.is_ok(), "{build}: a hang is not interruptible; the step completes afterwards");
    }
}

/// Run in a child process by `abort_at_step_aborts_the_hosting_process`.
#[test]
#[ignore = "aborts its process; run by abort_at_step_aborts_the_hosting_process"]
fn abort_child() {
    let build = std::env::var("ABORT_BUILD").unwrap_or_default();
    let api = if build == "library" { BackendApi::load(Path::new(LIB)).unwrap() } else { BackendApi::builtin() };
    let mut b = duplex(&api, &[("abort_at_step", "2")]);
    run_duplex_step(b.as_mut(), &chunk(loud())).unwrap();
    println!("step 1 done");
    let _ = run_duplex_step(b.as_mut(), &chunk(loud()));
    println!("step 2 returned");
}

#[test]
fn abort_at_step_aborts_the_hosting_process() {
    use std::os::unix::process::ExitStatusExt;
    for build in ["builtin", "library"] {
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "backend_abi::abort_child", "--ignored", "--nocapture", "--test-threads=1"])
            .env("ABORT_BUILD", build)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.signal(), Some(6), "{build}: SIGABRT expected, got {:?}\n{stdout}", out.status);
        assert!(stdout.contains("step 1 done") && !stdout.contains("step 2 returned"), "{build}: {stdout}");
    }
}

#[test]
fn invalid_arguments_and_states_are_errors_with_reasons() {
    for (build, api) in builds() {
        let mut b = api.open(&[]).unwrap();
        assert!(
            matches!(b.duplex_generate(), Err(BackendError::BadState(m)) if m.contains("without a prefilled chunk")),
            "{build}"
        );
        assert!(
            matches!(b.duplex_prefill(&chunk(loud())), Err(BackendError::BadState(m)) if m.contains("no duplex session")),
            "{build}"
        );
        assert!(matches!(b.turn_generate(), Err(BackendError::BadState(_))), "{build}");
        let mut setup = SessionSetup::new(SessionKind::Duplex);
        setup.generation.max_slice_nums = Some(12);
        assert!(
            matches!(b.prepare(&setup), Err(BackendError::InvalidArgument(m)) if m.contains("max_slice_nums 12")),
            "{build}"
        );
        b.prepare(&SessionSetup::new(SessionKind::Duplex)).unwrap();
        assert!(
            matches!(b.prepare(&SessionSetup::new(SessionKind::Duplex)), Err(BackendError::BadState(m)) if m.contains("reset first")),
            "{build}"
        );
        assert!(
            matches!(b.duplex_prefill(&chunk(Vec::new())), Err(BackendError::InvalidArgument(m)) if m.contains("audio is empty")),
            "{build}"
        );
        let empty_frame = DuplexChunk { frames: vec![Vec::new()], ..chunk(loud()) };
        assert!(
            matches!(b.duplex_prefill(&empty_frame), Err(BackendError::InvalidArgument(m)) if m.contains("frame 0 is empty")),
            "{build}"
        );
        // ABI 1.3: a duplex session answers a turn between its steps, never in the middle of one.
        b.duplex_prefill(&chunk(loud())).unwrap();
        assert!(
            matches!(b.turn_prefill(&TurnInput::default()), Err(BackendError::BadState(m)) if m.contains("middle of a duplex step")),
            "{build}: a turn in the middle of a step"
        );
        b.duplex_finalize().unwrap();
        assert!(matches!(b.duplex_finalize(), Err(BackendError::BadState(_))), "{build}");
        // after all these refusals the session still works
        assert_eq!(run_duplex_step(&mut b, &chunk(loud())).unwrap().kind, StepKind::Listen, "{build}");
        // A turn's answer not read to its end (its user interrupted between two pieces) is
        // abandoned by the next step, as by the next turn.
        let typed =
            TurnInput { messages: vec![ChatMessage::text(Role::User, "one two three")], ..TurnInput::default() };
        b.turn_prefill(&typed).unwrap();
        assert!(!b.turn_generate().unwrap().done, "{build}: an answer of more than one piece");
        assert!(run_duplex_step(&mut b, &chunk(loud())).is_ok(), "{build}: a step after an abandoned answer");
        b.turn_prefill(&typed).unwrap();
        assert!(run_duplex_step(&mut b, &chunk(loud())).is_ok(), "{build}: a step after an answer never read");

        // Before 1.3 a turn answers a user's message; since, it may speak first.
        let mut older = api.open(&opts(&[("revision", "2")])).unwrap();
        older.prepare(&SessionSetup::new(SessionKind::Turn)).unwrap();
        let no_user = TurnInput { messages: vec![ChatMessage::text(Role::System, "hi")], ..TurnInput::default() };
        assert!(
            matches!(older.turn_prefill(&no_user), Err(BackendError::InvalidArgument(m)) if m.contains("no user message")),
            "{build}"
        );
        assert!(
            matches!(older.turn_prefill(&TurnInput::default()), Err(BackendError::InvalidArgument(m)) if m.contains("no messages")),
            "{build}"
        );
        b.reset().unwrap();
        b.prepare(&SessionSetup::new(SessionKind::Turn)).unwrap();
        b.turn_prefill(&no_user).unwrap();
        assert_eq!(b.turn_generate().unwrap().text, "Hello!", "{build}: a 1.3 backend speaks first");
    }
}

#[test]
fn open_failures_name_the_option() {
    for (build, api) in builds() {
        match api.open(&opts(&[("stepms", "1")])) {
            Err(BackendError::Open(m)) => {
                assert!(m.contains("unknown option 'stepms'"), "{build}: {m}")
            }
            other => panic!("{build}: expected an open error, got {:?}", other.map(|_| ())),
        }
        match api.open(&opts(&[("n_ctx", "-4")])) {
            Err(BackendError::Open(m)) => {
                assert!(m.contains("n_ctx") && m.contains("non-negative integer"), "{build}: {m}")
            }
            other => panic!("{build}: expected an open error, got {:?}", other.map(|_| ())),
        }
    }
}

#[test]
fn load_failures_name_the_path_and_the_reason() {
    let missing = BackendApi::load(Path::new("/nonexistent/libx.so")).err().unwrap();
    assert!(matches!(missing, LoadError::Library { .. }));
    assert!(missing.to_string().starts_with("/nonexistent/libx.so: cannot load the library:"), "{missing}");

    let wrong = BackendApi::load(Path::new(env!("OMNI_REFERENCE_LIB_WRONG_ABI"))).err().unwrap();
    assert!(matches!(wrong, LoadError::Version { found: 2, expected: 1, .. }), "{wrong}");
    assert!(wrong.to_string().contains("built for backend ABI version 2, this server speaks version 1"), "{wrong}");

    // A real shared library that is not a backend.
    let libm = ["/lib/x86_64-linux-gnu/libm.so.6", "/usr/lib/x86_64-linux-gnu/libm.so.6", "/lib64/libm.so.6"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("libm on this machine");
    let not_backend = BackendApi::load(Path::new(libm)).err().unwrap();
    assert!(not_backend.to_string().contains("missing symbol omni_backend_abi_version"), "{not_backend}");
}
