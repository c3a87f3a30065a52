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
    sync::atomic::{AtomicBool, AtomicI32, Ordering},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crossterm::{
    cursor,
    event::{self, Event, KeyEventKind},
    execute,
    terminal::{self, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{backend::CrosstermBackend, widgets::TableState, Terminal};

use crate::{
    config::Config,
    run::{self, Handles},
};
use gpu_model::SourceStatus;
use view::{Action, App};

/// How long `--once` waits for the first GPU sample (or NVML saying it is unavailable).
const FIRST_SAMPLE_TIMEOUT: Duration = Duration::from_secs(5);
/// The live view redraws at least this often (a key redraws at once).
const REFRESH: Duration = Duration::from_millis(250);
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

/// Starts the sources, shows them (live, or one plain frame with `--once`), stops them.
pub fn main(config: Config, prep_error: Option<String>, opts: Options) -> ExitCode {
    if !opts.once && !io::stdout().is_terminal() {
        eprintln!("gpu-agent top: stdout is not a terminal (use --once for a plain-text frame)");
        return ExitCode::from(2);
    }
    let node = run::node_identity(&config);
    let host = node.node_name.unwrap_or(node.host_name);
    let (handles, stop, thread) = match run::spawn_embedded(config, prep_error) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("gpu-agent top: {e:#}");
            return ExitCode::FAILURE;
        }
    };
    let code = if opts.once {
        once(&handles, &thread, &host)
    } else {
        match live(&handles, &thread, &host, &opts.log_file) {
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
    };
    let _ = stop.send(true);
    // They stop within a poll interval; a stuck NVML call must not keep us from exiting.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !thread.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    if thread.is_finished() {
        let _ = thread.join();
    }
    code
}

fn once(handles: &Handles, thread: &JoinHandle<()>, host: &str) -> ExitCode {
    let deadline = Instant::now() + FIRST_SAMPLE_TIMEOUT;
    loop {
        let sampled = handles.snapshot.read().unwrap().taken_at_ms != 0;
        let disabled = handles.snapshot.read().unwrap().nvml == SourceStatus::Disabled;
        if sampled || disabled || thread.is_finished() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let snap = handles.snapshot.read().unwrap().clone();
    let mut app = App::expanding_all();
    let model = app.model(&snap, &handles.stats.report(&snap.nvml), host, false);
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

/// Ok(true): the user quit; Ok(false): the sources stopped under us.
fn live(
    handles: &Handles,
    thread: &JoinHandle<()>,
    host: &str,
    log_file: &std::path::Path,
) -> io::Result<bool> {
    let mut tui = Tui::enter(log_file)?;
    let mut app = App::default();
    let mut table = TableState::default();
    loop {
        if thread.is_finished() {
            return Ok(false);
        }
        let snap = handles.snapshot.read().unwrap().clone();
        let model = app.model(&snap, &handles.stats.report(&snap.nvml), host, true);
        tui.terminal
            .draw(|f| ui::render(&model, f.area(), f.buffer_mut(), &mut table))?;
        // One event per frame, so that each key acts on the order it was pressed over.
        if event::poll(REFRESH)? {
            if let Event::Key(k) = event::read()? {
                if k.kind == KeyEventKind::Press && app.on_key(k, &model.order) == Action::Quit {
                    return Ok(true);
                }
            }
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
