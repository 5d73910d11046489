// @ts-check
// The two-press Cancel of a worker that stops at its next step when asked (a training, a generation, a
// ladder sweep): the first press asks it to stop and keep what it has, and the button becomes "Stop
// now"; a second press ends it at once. The app answers each press (`CancelAnswer`).

/** @typedef {import('./types.js').CancelAnswer} CancelAnswer */

/**
 * What one panel's Cancel asks and where it tells the user.
 * @typedef {object} CancelWiring
 * @property {() => Promise<CancelAnswer>} cancel the command that presses it
 * @property {string} stopping what the worker does after a first press, e.g. 'Stopping after this step…'
 * @property {(text: string) => void} say shows the stop's progress in the panel's status
 * @property {(error: unknown) => void} failed shows a press the app could not carry out
 * @property {() => void} [idle] when nothing was running any more
 */

/**
 * Wires `button` as a two-press Cancel.
 * @param {HTMLButtonElement} button @param {CancelWiring} wiring
 */
export function wireCancel(button, { cancel, stopping, say, failed, idle }) {
  button.addEventListener('click', async () => {
    try {
      const answer = await cancel();
      if (answer === 'stopping') {
        say(`${stopping} (press again to stop now)`);
        button.textContent = 'Stop now';
      } else if (answer === 'killed') {
        say('Stopping now…');
      } else {
        idle?.();
      }
    } catch (error) {
      failed(error);
    }
  });
}

/**
 * The button as a run starts or ends: its next press is a first one again.
 * @param {HTMLButtonElement} button
 */
export function resetCancel(button) {
  button.textContent = 'Cancel';
}
