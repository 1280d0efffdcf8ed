/**
 * jupyter-gpualloc in JupyterLab: the GPUs panel in the left sidebar, the status-bar item,
 * notifications of lease and job events, "Run as GPU job" for notebooks in the file browser, and
 * the outputs of `%%gpu job` cells (live from the API, so they outlive the kernel's widgets).
 */

import { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Dialog, InputDialog, showDialog } from '@jupyterlab/apputils';
import { PageConfig } from '@jupyterlab/coreutils';
import { IFileBrowserFactory } from '@jupyterlab/filebrowser';
import { INotebookTracker } from '@jupyterlab/notebook';
import { IRenderMimeRegistry } from '@jupyterlab/rendermime';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Signal } from '@lumino/signaling';

import { GpuApi } from './api';
import { GpuModel } from './gpumodel';
import { IJobActions } from './components/jobs';
import { outputFactories } from './components/outputs';
import { ICurrentNotebook } from './components/request';
import { ISliceActions } from './components/slices';
import { kernelOfHolder, Question, releaseQuestion } from './model/format';
import { cancelQuestion } from './model/jobs';
import { offerAvailability } from './model/request';
import { GpuPanel } from './panel';
import { GpuStatus } from './statusbar';

import gpuSvg from '../style/gpu.svg';

export const gpuIcon = new LabIcon({ name: 'jupyter-gpualloc:gpu', svgstr: gpuSvg });

const PANEL_ID = 'jp-gpualloc-panel';
const RUN_AS_JOB = 'gpualloc:run-as-job';
const OPEN_PANEL = 'gpualloc:open-panel';

const plugin: JupyterFrontEndPlugin<void> = {
  id: 'jupyter-gpualloc:plugin',
  description: 'GPU slices in JupyterLab: the GPUs panel, the status bar item and GPU jobs.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [IStatusBar, IFileBrowserFactory, IRenderMimeRegistry],
  activate: (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    statusBar: IStatusBar | null,
    browsers: IFileBrowserFactory | null,
    rendermime: IRenderMimeRegistry | null
  ) => {
    const notebookOfKernel = (kernelId: string) =>
      notebooks.find(panel => panel.sessionContext.session?.kernel?.id === kernelId) ?? null;
    // the notebook a kernel ran, still named once the kernel was shut down (its slice released, or idle)
    const ranIn = new Map<string, string>();
    const pathOfKernel = (kernelId: string): string | null => {
      const path = notebookOfKernel(kernelId)?.context.path;
      if (path) {
        ranIn.set(kernelId, path);
      }
      return path ?? ranIn.get(kernelId) ?? null;
    };
    const model = new GpuModel(
      new GpuApi(app.serviceManager.serverSettings, PageConfig.getOption('serverRoot')),
      pathOfKernel
    );
    const currentChanged = new Signal<unknown, void>(notebooks);
    notebooks.currentChanged.connect(() => currentChanged.emit());
    notebooks.widgetAdded.connect((_, panel) =>
      panel.sessionContext.kernelChanged.connect(() => currentChanged.emit())
    );

    const currentNotebook = (): ICurrentNotebook | null => {
      const panel = notebooks.currentWidget;
      if (!panel) {
        return null;
      }
      return { path: panel.context.path, kernelId: panel.sessionContext.session?.kernel?.id ?? null };
    };
    const open = (path: string) => void app.commands.execute('docmanager:open', { path });
    const confirm = async (question: Question): Promise<boolean> => {
      const answer = await showDialog({
        title: question.title,
        body: question.body,
        buttons: [Dialog.cancelButton(), Dialog.warnButton({ label: question.accept })]
      });
      return answer.button.accept;
    };

    const jobs: IJobActions = {
      cancel: async job => {
        const question = cancelQuestion(job);
        if (question && !(await confirm(question))) {
          return;
        }
        await model.jobAction(() => model.api.cancelJob(job.id));
      },
      rerun: job => void model.jobAction(() => model.api.rerunJob(job.id)),
      openExecuted: async (job, copy) => {
        const content = await model.act(() => model.api.executedNotebook(job.id));
        if (content) {
          await app.serviceManager.contents.save(copy, { type: 'notebook', format: 'json', content });
          open(copy);
        }
      }
    };

    const slices: ISliceActions = {
      release: async lease => {
        const kernelId = kernelOfHolder(lease.holder);
        const question = releaseQuestion(lease, kernelId ? pathOfKernel(kernelId) : null);
        if (question && !(await confirm(question))) {
          return;
        }
        await model.release(lease.id);
      },
      keep: lease => void model.keep(lease.id),
      extendDeadline: lease => void model.extendDeadline(lease.id),
      notebookOf: pathOfKernel,
      openNotebook: kernelId => {
        const found = notebookOfKernel(kernelId);
        if (found) {
          app.shell.activateById(found.id);
        }
      },
      restartKernel: async (lease, kernelId) => {
        const found = notebookOfKernel(kernelId);
        if (found) {
          await found.sessionContext.restartKernel();
          model.clearNote(lease.id);
        }
      }
    };

    const panel = new GpuPanel({
      model,
      currentNotebook,
      currentChanged,
      slices,
      jobs,
      confirm
    });
    panel.id = PANEL_ID;
    panel.title.icon = gpuIcon;
    panel.title.caption = 'GPUs';
    app.shell.add(panel, 'left', { rank: 650 });
    outputFactories(model, jobs, slices).forEach(factory => rendermime?.addFactory(factory));

    app.commands.addCommand(OPEN_PANEL, {
      label: 'Show the GPUs panel',
      execute: () => app.shell.activateById(PANEL_ID)
    });

    if (statusBar) {
      const status = new GpuStatus(
        model,
        () => void app.commands.execute(OPEN_PANEL),
        () => currentNotebook()?.kernelId ?? null,
        currentChanged
      );
      statusBar.registerStatusItem('jupyter-gpualloc:status', {
        item: status,
        align: 'left',
        rank: 4
      });
    }

    app.commands.addCommand(RUN_AS_JOB, {
      label: 'Run as GPU job',
      caption: 'Run this notebook in the background on a GPU slice',
      icon: gpuIcon,
      isVisible: () => {
        if (model.phase === 'off' || model.phase === 'stopped') {
          return false; // no GPU jobs here now: the panel says why
        }
        const item = browsers?.tracker.currentWidget?.selectedItems().next();
        return !!item && !item.done && item.value.path.endsWith('.ipynb');
      },
      execute: async () => {
        const item = browsers?.tracker.currentWidget?.selectedItems().next();
        if (!item || item.done) {
          return;
        }
        const path = item.value.path;
        await model.refresh();
        if (model.refusedHolders.job) {
          await showDialog({
            title: `Run ${path} as a GPU job`,
            body: model.refusedHolders.job,
            buttons: [Dialog.okButton()]
          });
          return;
        }
        const labels = model.offers.map(o => `${o.label} (${offerAvailability(o).text})`);
        const choice = await InputDialog.getItem({
          title: `Run ${path} as a GPU job`,
          label: 'Slice',
          items: labels
        });
        const offer = model.offers[labels.indexOf(choice.value ?? '')];
        if (!choice.button.accept || !offer) {
          return;
        }
        const job = await model.jobAction(() => model.api.submitJob(path, offer.spec));
        if (job) {
          app.shell.activateById(PANEL_ID);
        }
      }
    });
    app.contextMenu.addItem({
      command: RUN_AS_JOB,
      selector: '.jp-DirListing-item[data-file-type="notebook"]',
      rank: 3
    });

    model.start();
  }
};

export default plugin;
