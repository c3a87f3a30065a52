//! Drawing a [`Model`] with ratatui into any buffer: the terminal's, or a plain one that
//! `--once` prints, so that both show the same frame.
use ratatui::{
    buffer::Buffer,
    layout::{Constraint, Layout, Rect},
    style::{Color, Modifier, Style},
    text::{Line as TextLine, Span},
    widgets::{
        Block, Cell, HighlightSpacing, Paragraph, Row, StatefulWidget, Table, TableState, Widget,
    },
};

use super::view::{bar, human_bytes, percent, ContainerRow, Level, Line, Model, SortBy, BAR_WIDTH};

/// Longest pod column: a pod UID (36) after the expand marker.
const POD_MAX: usize = 40;

fn header_style() -> Style {
    Style::new().add_modifier(Modifier::BOLD).fg(Color::Cyan)
}

fn text_width(s: &str) -> u16 {
    s.chars().count().min(u16::MAX as usize) as u16
}

/// Rows a frame needs to show everything at once (the plain-text frame is not scrolled).
pub fn height(model: &Model) -> u16 {
    let devices = model.devices.len().max(1) as u16 + 3;
    let containers = model.lines.len().max(1) as u16 + 3;
    1 + model.notices.len() as u16 + devices + containers + u16::from(model.interactive)
}

pub fn render(model: &Model, area: Rect, buf: &mut Buffer, state: &mut TableState) {
    let device_height = model.devices.len().max(1) as u16 + 3;
    let [title, notices, devices, containers, footer] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(model.notices.len() as u16),
        Constraint::Length(device_height),
        Constraint::Min(4),
        Constraint::Length(u16::from(model.interactive)),
    ])
    .areas(area);
    Paragraph::new(model.title.as_str())
        .style(Style::new().add_modifier(Modifier::BOLD))
        .render(title, buf);
    render_notices(model, notices, buf);
    render_devices(model, devices, buf);
    render_containers(model, containers, buf, state);
    if model.interactive {
        render_footer(model, footer, buf);
    }
}

fn render_notices(model: &Model, area: Rect, buf: &mut Buffer) {
    let lines: Vec<TextLine> = model
        .notices
        .iter()
        .map(|n| {
            let style = match n.level {
                Level::Error => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                Level::Warn => Style::new().fg(Color::Yellow),
                Level::Info => Style::new().fg(Color::Cyan),
            };
            TextLine::styled(format!("! {}", n.text), style)
        })
        .collect();
    Paragraph::new(lines).render(area, buf);
}

fn render_devices(model: &Model, area: Rect, buf: &mut Buffer) {
    let block = Block::bordered().title(" GPUs ");
    if model.devices.is_empty() {
        let inner = block.inner(area);
        block.render(area, buf);
        Paragraph::new("no GPU seen").render(inner, buf);
        return;
    }
    let name_w = model
        .devices
        .iter()
        .map(|d| text_width(&d.name))
        .max()
        .unwrap_or(4)
        .clamp(4, 32);
    let mem_w = model
        .devices
        .iter()
        .map(|d| text_width(&d.memory))
        .max()
        .unwrap_or(6)
        .max(6);
    let rows = model.devices.iter().map(|d| {
        let bar_style = match d.memory_fraction {
            Some(f) if f >= 0.9 => Style::new().fg(Color::Red),
            Some(f) if f >= 0.75 => Style::new().fg(Color::Yellow),
            _ => Style::new().fg(Color::Green),
        };
        let util_style = if d.ok {
            Style::new()
        } else {
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD)
        };
        Row::new(vec![
            Cell::from(d.index.to_string()),
            Cell::from(d.name.clone()),
            Cell::from(d.util.clone()).style(util_style),
            Cell::from(bar(d.memory_fraction.unwrap_or(0.0), BAR_WIDTH)).style(bar_style),
            Cell::from(d.memory.clone()),
            Cell::from(d.power.clone()),
            Cell::from(d.temperature.clone()),
        ])
    });
    let widths = [
        Constraint::Length(3),
        Constraint::Length(name_w),
        Constraint::Length(6),
        Constraint::Length(BAR_WIDTH as u16),
        Constraint::Length(mem_w),
        Constraint::Length(6),
        Constraint::Length(5),
    ];
    let header = Row::new([
        "#",
        "NAME",
        "UTIL",
        "MEMORY",
        "USED / TOTAL",
        "POWER",
        "TEMP",
    ])
    .style(header_style());
    let table = Table::new(rows, widths)
        .header(header)
        .block(block)
        .column_spacing(2);
    Widget::render(table, area, buf);
}

fn render_containers(model: &Model, area: Rect, buf: &mut Buffer, state: &mut TableState) {
    let rows_count = model
        .lines
        .iter()
        .filter(|l| matches!(l, Line::Container { .. }))
        .count();
    let block = Block::bordered().title(format!(
        " Containers on GPUs ({rows_count}), sorted by {} ",
        model.sort.label()
    ));
    if model.lines.is_empty() {
        let inner = block.inner(area);
        block.render(area, buf);
        Paragraph::new("no process is using a GPU").render(inner, buf);
        return;
    }
    let first = first_cells(model);
    let widths = column_widths(model, &first);
    let rows = model.lines.iter().zip(first).map(|(l, f)| table_row(l, f));
    let table = Table::new(rows, widths)
        .header(header(model))
        .block(block)
        .column_spacing(2)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">")
        .highlight_spacing(if model.interactive {
            HighlightSpacing::Always
        } else {
            HighlightSpacing::Never
        });
    state.select(model.selected_line);
    StatefulWidget::render(table, area, buf, state);
}

/// The first column: the pod of a container row, the pid and command of a process row.
fn first_cells(model: &Model) -> Vec<String> {
    model
        .lines
        .iter()
        .map(|l| match l {
            Line::Container { row, expanded } => {
                format!("{} {}", if *expanded { "▾" } else { "▸" }, row.pod)
            }
            Line::Process(p) => format!(
                "  └ {} {}{}",
                p.pid,
                p.comm,
                if p.exited { " (exited)" } else { "" }
            ),
        })
        .collect()
}

/// Text columns as wide as their widest cell (capped), the numbers fixed.
fn column_widths(model: &Model, first: &[String]) -> [Constraint; 10] {
    let width = |f: &dyn Fn(&ContainerRow) -> &str, title: &str, max: usize| {
        model
            .lines
            .iter()
            .filter_map(|l| match l {
                Line::Container { row, .. } => Some(f(row).chars().count()),
                _ => None,
            })
            .chain([title.len()])
            .max()
            .unwrap_or(0)
            .min(max) as u16
    };
    let pod_w = first
        .iter()
        .map(|s| s.chars().count())
        .chain([5])
        .max()
        .unwrap_or(5)
        .min(POD_MAX) as u16;
    [
        Constraint::Length(pod_w),
        Constraint::Length(width(&|r| &r.namespace, "NAMESPACE", 24)),
        Constraint::Length(width(&|r| &r.container, "CONTAINER", 32)),
        Constraint::Length(width(&|r| &r.gpu, "GPU", 12)),
        Constraint::Length(10),
        Constraint::Length(4),
        Constraint::Length(4),
        Constraint::Length(4),
        Constraint::Length(4),
        Constraint::Length(6),
    ]
}

fn header(model: &Model) -> Row<'static> {
    let sorted = |by: SortBy, name: &str| {
        if model.sort == by {
            Cell::from(format!("{name}▼")).style(header_style().fg(Color::Yellow))
        } else {
            Cell::from(name.to_string())
        }
    };
    Row::new(vec![
        Cell::from("POD"),
        Cell::from("NAMESPACE"),
        Cell::from("CONTAINER"),
        Cell::from("GPU"),
        sorted(SortBy::Memory, "MEMORY"),
        sorted(SortBy::Utilization, "SM%"),
        Cell::from("MEM%"),
        Cell::from("ENC%"),
        Cell::from("DEC%"),
        Cell::from("PROCS"),
    ])
    .style(header_style())
}

fn table_row(line: &Line, first: String) -> Row<'static> {
    match line {
        Line::Container { row, .. } => Row::new(vec![
            Cell::from(first),
            Cell::from(row.namespace.clone()),
            Cell::from(row.container.clone()),
            Cell::from(row.gpu.clone()),
            Cell::from(human_bytes(row.memory_bytes)),
            Cell::from(percent(row.util.sm)),
            Cell::from(percent(row.util.mem)),
            Cell::from(percent(row.util.enc)),
            Cell::from(percent(row.util.dec)),
            Cell::from(if row.idle_allocation {
                format!("{} idle", row.pids.len())
            } else {
                row.pids.len().to_string()
            }),
        ])
        .style(if row.idle_allocation {
            Style::new().fg(Color::Yellow)
        } else {
            Style::new()
        }),
        Line::Process(p) => Row::new(vec![
            Cell::from(first),
            Cell::from(""),
            Cell::from(""),
            Cell::from(""),
            Cell::from(human_bytes(p.memory_bytes)),
            Cell::from(percent(p.util.sm)),
            Cell::from(percent(p.util.mem)),
            Cell::from(percent(p.util.enc)),
            Cell::from(percent(p.util.dec)),
            Cell::from(""),
        ])
        .style(Style::new().add_modifier(Modifier::DIM)),
    }
}

fn render_footer(model: &Model, area: Rect, buf: &mut Buffer) {
    let key =
        |k: &'static str| Span::styled(k, Style::new().bold().fg(Color::Black).bg(Color::Cyan));
    let active = |by: SortBy, text: &'static str| {
        if model.sort == by {
            Span::styled(text, Style::new().fg(Color::Yellow).bold())
        } else {
            Span::raw(text)
        }
    };
    TextLine::from(vec![
        key(" q "),
        Span::raw(" quit  "),
        key(" ↑↓ j k "),
        Span::raw(" move  "),
        key(" Enter e "),
        Span::raw(" expand  "),
        key(" m "),
        active(SortBy::Memory, " sort by memory  "),
        key(" u "),
        active(SortBy::Utilization, " sort by utilization "),
    ])
    .render(area, buf);
}

/// The buffer's characters, one line per row, trailing blanks trimmed: no escape codes.
pub fn buffer_text(buf: &Buffer) -> String {
    let width = buf.area.width.max(1) as usize;
    let mut out = String::new();
    for row in buf.content().chunks(width) {
        let line: String = row.iter().map(|c| c.symbol()).collect();
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// One frame as plain text, `width` columns wide and as tall as it needs.
pub fn plain(model: &Model, width: u16) -> String {
    let area = Rect::new(0, 0, width, height(model));
    let mut buf = Buffer::empty(area);
    render(model, area, &mut buf, &mut TableState::default());
    buffer_text(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::top::view::{tests::snapshot, App};
    use gpu_model::{AgentStats, SourceStatus, TrackingMode};

    fn sources(nvml: SourceStatus) -> AgentStats {
        AgentStats {
            nvml,
            mode: TrackingMode::Ebpf,
            cached_processes: 42,
            ..Default::default()
        }
    }

    #[test]
    fn the_plain_frame_shows_gpus_containers_and_processes_without_escapes() {
        let mut app = App::expanding_all();
        let model = app.model(&snapshot(), &sources(SourceStatus::Ok), "node-1", false);
        let text = plain(&model, 120);
        assert!(!text.contains('\x1b'), "{text}");
        assert!(
            text.starts_with("gpu-agent top | node-1 | driver 580.159.04"),
            "{text}"
        );
        assert!(text.contains("NVIDIA H100 80GB HBM3"), "{text}");
        let row = text
            .lines()
            .find(|l| l.contains("aaaaaaaaaaaa"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(row.contains("1.5 GiB"), "{row}");
        assert!(row.contains(" 80 "), "{row}");
        assert!(text.lines().any(|l| l.contains("└ 101 python")), "{text}");
        assert!(text.lines().any(|l| l.contains("host")), "{text}");
        assert!(!text.contains(" quit "), "no key help in a plain frame");
        // Memory order: B (4 GiB) before A (1.5 GiB).
        let pos = |s: &str| text.find(s).unwrap();
        assert!(pos("bbbbbbbbbbbb") < pos("aaaaaaaaaaaa"));
        assert_eq!(text.lines().count(), height(&model) as usize);
    }

    #[test]
    fn the_live_frame_marks_the_selection_and_lists_the_keys() {
        let mut app = App::default();
        let model = app.model(&snapshot(), &sources(SourceStatus::Ok), "node-1", true);
        let area = Rect::new(0, 0, 120, 30);
        let mut buf = Buffer::empty(area);
        render(&model, area, &mut buf, &mut TableState::default());
        let text = buffer_text(&buf);
        let selected = text.lines().find(|l| l.contains('>')).unwrap();
        assert!(selected.contains("bbbbbbbbbbbb"), "{text}");
        let footer = text.lines().nth(29).unwrap();
        for k in ["q", "quit", "Enter e", "m", "sort by memory", "u"] {
            assert!(footer.contains(k), "{footer}");
        }
    }

    #[test]
    fn a_missing_driver_is_said_above_the_tables() {
        let snap = gpu_model::Snapshot {
            taken_at_ms: 1,
            nvml: SourceStatus::Unavailable("Driver Not Loaded".into()),
            ..Default::default()
        };
        let mut app = App::default();
        let model = app.model(
            &snap,
            &sources(SourceStatus::Unavailable("Driver Not Loaded".into())),
            "n",
            false,
        );
        let text = plain(&model, 100);
        assert!(
            text.contains("! NVML unavailable: Driver Not Loaded"),
            "{text}"
        );
        assert!(text.contains("no GPU seen"), "{text}");
        assert!(text.contains("no process is using a GPU"), "{text}");
    }

    #[test]
    fn a_narrow_terminal_still_draws() {
        let mut app = App::default();
        let model = app.model(&snapshot(), &sources(SourceStatus::Ok), "n", true);
        for (w, h) in [(40, 10), (1, 1), (200, 60)] {
            let area = Rect::new(0, 0, w, h);
            let mut buf = Buffer::empty(area);
            render(&model, area, &mut buf, &mut TableState::default());
        }
    }
}
