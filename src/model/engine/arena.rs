//! The state of every stream of a model, as rows of one state: a stream holds a row from its
//! start to its end. A step runs on its streams' rows in place where they follow one another
//! (one stream's, or a server's first sessions'); else it selects them (one `index_select` per
//! state tensor, whatever the number of rows) and puts them back (one `index_copy_` each), about
//! 5 MB a row at the released widths. A CUDA graph records that selection with the rows as a
//! device tensor of indices, so any cohort of streams replays the same graph.
//!
//! Who holds which row is a table of its own (behind its own lock, see [`RowAssignment`]): a new
//! stream takes a free row without waiting for the compute thread, which may be running a batch
//! for hundreds of milliseconds; its first step clears it there. Only growing, releasing and
//! shrinking need the compute thread.
//!
//! Row 0 belongs to no stream: it is the scratch row that pads a batch up to a graph's size and
//! that graphs warm up on. Nobody reads it.
//!
//! The rows grow in place of need (doubling; the old rows copied over), and shrink (halving)
//! when streams have ended and the scratch row and the rows held would fit in the lowest
//! quarter: the memory follows the streams open, whichever rows they hold, with room to double
//! before growing again. A shrink keeps the lowest rows and moves each row held above them down
//! to a free one, its state with it (the rows kept are selected into new memory in one go). So
//! a stream's row number may change between its steps: a stream holds a [`Row`], which the
//! arena updates, and its steps read the number on the compute thread with the arena in hand,
//! where nothing moves it meanwhile (a step waiting in the queue reads it when its batch runs).
//! Rows are handed out lowest first, so that few rows need moving. Growing or shrinking moves
//! every row to new memory, so graphs recorded before are void (see [`Arena::generation`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tch::Tensor;

use crate::model::error::TorchResult;
use crate::model::log;
use crate::model::network::{Network, State, StepTables};

/// The row that pads batches and warms graphs up.
pub const SCRATCH_ROW: i64 = 0;

/// The rows of a new arena, and the fewest it shrinks to.
const MIN_ROWS: i64 = 4;

/// A stream's row of the arena. A shrink may move it to another number (see the module's
/// comment): read [`Row::index`] with the arena in hand, not before.
#[derive(Clone)]
pub struct Row(Arc<AtomicI64>);

impl Row {
    /// The scratch row, for steps that belong to no stream (timing, warming up).
    pub fn scratch() -> Self {
        Self::at(SCRATCH_ROW)
    }

    fn at(index: i64) -> Self {
        Self(Arc::new(AtomicI64::new(index)))
    }

    /// Its number in the arena now. Only [`Arena::release`] moves rows, with the arena in hand:
    /// whoever reads the number with the arena in hand (a step) steps on the row it names.
    pub fn index(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }

    /// The same for every clone of a stream's row, whatever number the row has.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    fn move_to(&self, index: i64) {
        self.0.store(index, Ordering::Relaxed);
    }
}

/// Who holds which row; shared by the arena (on the compute thread, which holds this lock while
/// it grows, releases or shrinks) and whoever hands rows to new streams.
#[derive(Clone, Default)]
pub struct RowAssignment(Arc<Mutex<Assignment>>);

#[derive(Default)]
struct Assignment {
    /// Rows no stream holds, the lowest last.
    free: Vec<i64>,
    /// The rows streams hold, by number: what a shrink moves.
    held: BTreeMap<i64, Row>,
}

impl Assignment {
    /// The lowest free row, now held by a new stream.
    fn take(&mut self) -> Option<Row> {
        let row = Row::at(self.free.pop()?);
        self.held.insert(row.index(), row.clone());
        Some(row)
    }
}

impl RowAssignment {
    fn lock(&self) -> MutexGuard<'_, Assignment> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The lowest free row, if there is one: a new stream's, which its first step clears
    /// (whatever an ended stream left in it).
    pub fn take(&self) -> Option<Row> {
        self.lock().take()
    }
}

#[derive(Default)]
pub struct Arena {
    /// None until the first stream starts.
    state: Option<State>,
    assignment: RowAssignment,
    generation: u64,
}

impl Arena {
    /// Who holds which row, for taking a free one without the compute thread.
    pub fn row_assignment(&self) -> RowAssignment {
        self.assignment.clone()
    }

    /// A row for a new stream, growing the rows if none is free; its first step clears it. On
    /// the device's compute thread.
    pub fn allocate(&mut self, network: &Network) -> TorchResult<Row> {
        let assignment = self.assignment.clone();
        let mut assignment = assignment.lock();
        if assignment.free.is_empty() {
            self.grow(network, &mut assignment.free)?;
        }
        Ok(assignment.take().expect("rows after growing"))
    }

    /// Gives `row` back, for a later stream, and shrinks the rows while the scratch row and the
    /// rows held would fit in the lowest quarter. On the device's compute thread.
    pub fn release(&mut self, row: &Row) -> TorchResult<()> {
        let assignment = self.assignment.clone();
        let mut assignment = assignment.lock();
        let index = row.index();
        if !assignment
            .held
            .get(&index)
            .is_some_and(|held| Arc::ptr_eq(&held.0, &row.0))
        {
            // Given back already, or another stream's: freed again, it would be handed to two
            // streams, which would then decode on one state.
            log::warning(format_args!(
                "row {index} given back by a stream that does not hold it: kept"
            ));
            return Ok(());
        }
        assignment.held.remove(&index);
        assignment.free.push(index);
        // Lowest last, so that the streams of a quiet model keep to the first rows.
        assignment.free.sort_unstable_by(|a, b| b.cmp(a));
        // The highest row in use once the rows held are moved down: right above the scratch row.
        let highest = SCRATCH_ROW + assignment.held.len() as i64;
        let mut rows = self.rows();
        while rows > MIN_ROWS && highest < rows / 4 {
            rows /= 2;
        }
        if rows < self.rows() {
            self.shrink(rows, &mut assignment)?;
        }
        Ok(())
    }

    /// Keeps the first `rows` rows, in memory of their own, each row held above them moved down
    /// to a free one, the lowest first: its state goes with it, and its stream's [`Row`] reads
    /// the new number.
    fn shrink(&mut self, rows: i64, assignment: &mut Assignment) -> TorchResult<()> {
        let mut free_below = assignment.free.iter().rev().filter(|&&row| row < rows);
        let moves: Vec<(i64, i64)> = assignment
            .held
            .range(rows..)
            .map(|(&from, _)| {
                let to = free_below
                    .next()
                    .expect("a free row below for each row held above: they fit in a quarter");
                (from, *to)
            })
            .collect();
        // Row `i` of the shrunk state is row `kept[i]` of this one.
        let mut kept: Vec<i64> = (0..rows).collect();
        for &(from, to) in &moves {
            kept[to as usize] = from;
        }
        // Before any bookkeeping: should it fail, the rows stay as they were.
        let shrunk = self.state().select_rows(&kept)?;
        let before = self.state().bytes();
        self.state = Some(shrunk);
        for &(from, to) in &moves {
            let row = assignment.held.remove(&from).expect("a row held");
            row.move_to(to);
            assignment.held.insert(to, row);
        }
        assignment.free = (SCRATCH_ROW + 1..rows)
            .rev()
            .filter(|row| !assignment.held.contains_key(row))
            .collect();
        self.generation += 1;
        give_back_freed_memory();
        log::debug(format_args!(
            "state arena shrunk to {rows} rows, {} of them moved down ({} MB, {} MB freed)",
            moves.len(),
            self.state().bytes() / 1_000_000,
            (before - self.state().bytes()) / 1_000_000
        ));
        Ok(())
    }

    fn grow(&mut self, network: &Network, free: &mut Vec<i64>) -> TorchResult<()> {
        let rows = self.rows();
        let grown_rows = (rows * 2).max(MIN_ROWS);
        let grown = match &self.state {
            Some(state) => state.grown_into(network.new_state(grown_rows)?)?,
            None => network.new_state(grown_rows)?,
        };
        self.state = Some(grown);
        free.extend((rows.max(SCRATCH_ROW + 1)..grown_rows).rev());
        self.generation += 1;
        log::debug(format_args!(
            "state arena grown to {grown_rows} rows ({} MB)",
            self.state().bytes() / 1_000_000
        ));
        Ok(())
    }

    /// Selects `rows` (arena indices, a device tensor) of the state, steps them over `codes`
    /// and puts them back: the batched step with its cohort given as a tensor, as a CUDA graph
    /// records it (and the eager path runs it).
    pub fn step_rows(
        &mut self,
        network: &Network,
        rows: &Tensor,
        codes: &Tensor,
        tables: &StepTables,
    ) -> TorchResult<Tensor> {
        let mut state = self.state().select(rows)?;
        let audio = network.step(codes, &mut state, tables)?;
        self.state_mut().put(rows, &state)?;
        Ok(audio)
    }

    /// Every row, the scratch row included.
    ///
    /// # Panics
    /// Before the first row is allocated.
    pub fn state(&self) -> &State {
        self.state
            .as_ref()
            .expect("the arena has rows once a stream started")
    }

    pub fn state_mut(&mut self) -> &mut State {
        self.state
            .as_mut()
            .expect("the arena has rows once a stream started")
    }

    pub fn rows(&self) -> i64 {
        self.state.as_ref().map_or(0, State::rows)
    }

    /// Counts the times the rows moved to new memory.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Bytes of one row.
    pub fn row_bytes(&self) -> usize {
        self.state
            .as_ref()
            .map_or(0, |state| state.bytes() / state.rows() as usize)
    }
}

/// Hands memory the allocator keeps after frees back to the system: glibc returns the large
/// blocks of the old rows at once, but keeps smaller freed ones (below its mmap threshold,
/// which rises as large blocks are freed) for reuse.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only releases free memory of its own heaps.
        unsafe {
            malloc_trim(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row given back twice (a stream's bookkeeping gone wrong) is freed once: two later
    /// streams never share it.
    #[test]
    fn a_row_given_back_twice_is_freed_once() {
        let network = Network::fixture("release-tiny");
        let mut arena = Arena::default();
        let (first, second) = (
            arena.allocate(&network).unwrap(),
            arena.allocate(&network).unwrap(),
        );
        arena.release(&first).unwrap();
        arena.release(&first).unwrap();
        let later = [
            arena.allocate(&network).unwrap(),
            arena.allocate(&network).unwrap(),
        ];
        let mut rows: Vec<i64> = [&second, &later[0], &later[1]]
            .iter()
            .map(|row| row.index())
            .collect();
        rows.sort();
        rows.dedup();
        assert_eq!(rows.len(), 3, "two streams share a row: {rows:?}");
    }
}
