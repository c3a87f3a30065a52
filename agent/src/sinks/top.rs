//! `gpu-agent top`: the node's GPUs and the containers using them, live in the terminal,
//! from the same sources as `run` running in-process. The rows, their order and the keys
//! are pure functions of a snapshot (`view`); `ui` draws them into any ratatui buffer, so
//! `--once` prints exactly the frame the live view shows.
mod ui;
mod view;

use std::{
    io::{self, IsTerminal, Stdout, Write},
    os::fd::AsRawFd,
    path::PathBuf,
    process::ExitCode,
    sync::{
        atomic::{AtomicBool, AtomicI32, Ordering},
        mpsc, Arc,
    },
    time::Duration,
};

use crossterm::{
    cursor,
    event::{self, Event, KeyEventKind},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{backend::CrosstermBackend, widgets::TableState, Terminal};

use gpu_model::{Snapshot, SourceStatus};

use crate::{pipeline::Published, stats::Stats};
use view::{Action, App};

/// How long `--once` waits for its frame: the first GPU sample (or NVML saying it is
/// unavailable), and one joined with the first names and allocations.
const FIRST_SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Width of the `--once` frame when stdout is not a terminal.
const PLAIN_WIDTH: u16 = 120;

pub struct Options {
    pub once: bool,
    /// Where the live view logs (stderr would scribble over the screen).
    pub log_file: PathBuf,
}

/// `--once` logs warnings to stderr (stdout is the frame); the live view logs to a file.
pub fn init_logging(opts: &Options) {
    let filter = |default: &str| {
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into())
    };
    if opts.once {
        tracing_subscriber::fmt()
            .with_env_filter(filter("warn"))
            .with_writer(io::stderr)
            .with_ansi(false)
            .init();
        return;
    }
    let file = open_log(&opts.log_file).and_then(|f| f.set_len(0).map(|_| f));
    match file {
        Ok(f) => tracing_subscriber::fmt()
            .with_env_filter(filter("info"))
            .with_writer(std::sync::Mutex::new(f))
            .with_ansi(false)
            .init(),
        // No log rather than a log over the screen; this line is still there after `q`.
        Err(e) => eprintln!(
            "gpu-agent top: cannot open the log file {}: {e}; not logging",
            opts.log_file.display()
        ),
    }
}

/// Appending, so that the tracing writer and stderr (redirected here while the screen is
/// ours) do not write over each other. O_NOFOLLOW: we run as root and the default path
/// is in a world-writable /tmp.
fn open_log(path: &std::path::Path) -> io::Result<std::fs::File> {
    std::os::unix::fs::OpenOptionsExt::custom_flags(
        std::fs::OpenOptions::new().create(true).append(true),
        libc::O_NOFOLLOW,
    )
    .open(path)
}

/// What `top` reads: the published snapshots and the agent's stats.
pub struct Feed {
    pub snapshot: Published,
    pub stats: Arc<Stats>,
    /// The node's name, for the title.
    pub host: String,
    /// The metadata sources run (`metadata.enabled`): `--once` waits for their names.
    pub metadata: bool,
}

/// Shows the sources (live, or one plain frame with `--once`) until the user quits or the
/// sources stop.
pub fn main(feed: Feed, opts: &Options) -> ExitCode {
    if opts.once {
        return once(feed);
    }
    match live(feed, &opts.log_file) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!(
                "gpu-agent top: the sources stopped (a signal, or an error: see {})",
                opts.log_file.display()
            );
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("gpu-agent top: terminal: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Refuses the live view where it cannot draw.
pub fn check_terminal(opts: &Options) -> Result<(), String> {
    if !opts.once && !io::stdout().is_terminal() {
        return Err("stdout is not a terminal (use --once for a plain-text frame)".into());
    }
    Ok(())
}

fn once(mut feed: Feed) -> ExitCode {
    if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
    {
        let wait = first_named_sample(&mut feed);
        let _ = rt.block_on(async { tokio::time::timeout(FIRST_SAMPLE_TIMEOUT, wait).await });
    }
    let snap = feed.snapshot.borrow().clone();
    let mut app = App::expanding_all();
    let model = app.model(&snap, &feed.stats.report(&snap.nvml), &feed.host, false);
    let width = if io::stdout().is_terminal() {
        terminal::size().map_or(PLAIN_WIDTH, |(w, _)| w)
    } else {
        PLAIN_WIDTH
    };
    // A closed pipe (`| head`) is not an error worth a panic.
    let _ = io::stdout()
        .lock()
        .write_all(ui::plain(&model, width).as_bytes());
    ExitCode::SUCCESS
}

/// Waits for the first GPU sample (or NVML saying it is off; the sources gone end the wait
/// too), then, while NVML answers, for one taken after the runtime and the kubelet first
/// answered: asked at start, they may answer after the first sample, whose rows would show
/// pod UIDs and lack the allocated, idle GPUs.
async fn first_named_sample(feed: &mut Feed) {
    let first = |s: &Arc<Snapshot>| s.taken_at_ms != 0 || s.nvml == SourceStatus::Disabled;
    if feed.snapshot.wait_for(first).await.is_err() {
        return;
    }
    let nvml_ok = feed.snapshot.borrow().nvml.is_ok();
    if !nvml_ok {
        return;
    }
    while feed.metadata && !metadata_answered(&feed.stats) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let answered_at = crate::pipeline::now_ms();
    let _ = feed
        .snapshot
        .wait_for(|s| s.taken_at_ms > answered_at)
        .await;
}

/// The CRI runtime and the kubelet's pod-resources have each answered (or been found
/// missing) once. Docker is asked only about containers they do not name.
fn metadata_answered(stats: &Stats) -> bool {
    let sources = stats.metadata.read().unwrap();
    ["cri", "pod_resources"].iter().all(|k| {
        sources
            .get(*k)
            .is_some_and(|s| *s != SourceStatus::Starting)
    })
}

/// What wakes the live view: it draws on each, and otherwise sleeps.
enum Wake {
    Key(event::KeyEvent),
    Redraw,
    SourcesGone,
}

/// Forwards key presses, resizes and new snapshots into one channel.
fn wakes(snapshot: Published) -> mpsc::Receiver<Wake> {
    let (tx, rx) = mpsc::channel();
    let keys = tx.clone();
    std::thread::spawn(move || loop {
        let wake = match event::read() {
            Ok(Event::Key(k)) if k.kind == KeyEventKind::Press => Wake::Key(k),
            Ok(Event::Resize(..)) => Wake::Redraw,
            Ok(_) => continue,
            Err(_) => return,
        };
        if keys.send(wake).is_err() {
            return;
        }
    });
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
            let _ = tx.send(Wake::SourcesGone);
            return;
        };
        let mut snapshot = snapshot;
        while rt.block_on(snapshot.changed()).is_ok() {
            if tx.send(Wake::Redraw).is_err() {
                return;
            }
        }
        let _ = tx.send(Wake::SourcesGone);
    });
    rx
}

/// Ok(true): the user quit; Ok(false): the sources stopped under us.
fn live(feed: Feed, log_file: &std::path::Path) -> io::Result<bool> {
    let mut tui = Tui::enter(log_file)?;
    let wakes = wakes(feed.snapshot.clone());
    let mut app = App::default();
    let mut table = TableState::default();
    loop {
        let snap = feed.snapshot.borrow().clone();
        let stats = feed.stats.report(&snap.nvml);
        let model = app.model(&snap, &stats, &feed.host, true);
        tui.terminal
            .draw(|f| ui::render(&model, f.area(), f.buffer_mut(), &mut table))?;
        // One wake per frame, so that each key acts on the order it was pressed over.
        match wakes.recv() {
            Ok(Wake::Key(k)) => {
                if app.on_key(k, &model.order) == Action::Quit {
                    return Ok(true);
                }
            }
            Ok(Wake::Redraw) => {}
            Ok(Wake::SourcesGone) | Err(_) => return Ok(false),
        }
    }
}

/// Set while the terminal is in raw mode on the alternate screen.
static TUI_ACTIVE: AtomicBool = AtomicBool::new(false);
/// The real stderr while fd 2 points at the log, else -1.
static SAVED_STDERR: AtomicI32 = AtomicI32::new(-1);

/// Raw mode and the alternate screen, undone on drop (quit, error, or unwinding panic).
struct Tui {
    terminal: Terminal<CrosstermBackend<Stdout>>,
}

impl Tui {
    fn enter(log_file: &std::path::Path) -> io::Result<Tui> {
        install_panic_hook();
        terminal::enable_raw_mode()?;
        TUI_ACTIVE.store(true, Ordering::SeqCst);
        redirect_stderr(log_file);
        let setup = || -> io::Result<Terminal<CrosstermBackend<Stdout>>> {
            execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
            Terminal::new(CrosstermBackend::new(io::stdout()))
        };
        match setup() {
            Ok(terminal) => Ok(Tui { terminal }),
            Err(e) => {
                restore();
                Err(e)
            }
        }
    }
}

impl Drop for Tui {
    fn drop(&mut self) {
        restore();
    }
}

/// Idempotent: the panic hook and the guard's drop both call it.
fn restore() {
    if TUI_ACTIVE.swap(false, Ordering::SeqCst) {
        let saved = SAVED_STDERR.swap(-1, Ordering::SeqCst);
        if saved >= 0 {
            // SAFETY: `saved` is our duplicate of the original fd 2.
            unsafe {
                libc::dup2(saved, 2);
                libc::close(saved);
            }
        }
        let _ = terminal::disable_raw_mode();
        let _ = execute!(io::stdout(), LeaveAlternateScreen, cursor::Show);
    }
}

/// Whatever writes to fd 2 behind our back (a C library: NVML itself) would land on the
/// screen: it goes to the log (or nowhere) until `restore`.
fn redirect_stderr(log_file: &std::path::Path) {
    let target =
        open_log(log_file).or_else(|_| std::fs::OpenOptions::new().write(true).open("/dev/null"));
    let Ok(target) = target else { return };
    // SAFETY: plain fd calls on fds we own; `target` is closed when dropped.
    unsafe {
        let saved = libc::dup(2);
        if saved >= 0 && libc::dup2(target.as_raw_fd(), 2) >= 0 {
            SAVED_STDERR.store(saved, Ordering::SeqCst);
        } else if saved >= 0 {
            libc::close(saved);
        }
    }
}

/// The screen is restored before the panic message prints, or the message would be lost
/// on the alternate screen. A panic on another thread (the sources) leaves the screen to
/// the live view, which sees the sources gone and quits; its message goes to the log.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let ui_thread = std::thread::current().id();
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if std::thread::current().id() == ui_thread {
                restore();
            }
            previous(info);
        }));
    });
}
